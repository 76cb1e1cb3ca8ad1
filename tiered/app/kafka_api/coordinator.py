"""The classic consumer-group protocol as a pure state machine: JoinGroup, SyncGroup,
Heartbeat, LeaveGroup and the checks of OffsetCommit, with time passed in (docs/kafka-api.md,
"Consumer groups").

A group moves through Kafka's states:

    EMPTY --join--> PREPARING_REBALANCE --all joined / deadline--> COMPLETING_REBALANCE
      ^                 ^     |                                          | leader's SyncGroup
      |                 |     +-- nobody left --> EMPTY                  v
      +-- last leaves --+---------- join, leave, session expiry ---- STABLE

* JoinGroup of a member puts the group in PREPARING_REBALANCE. The rebalance completes when
  every member has (re)joined, or at the deadline (the largest rebalance timeout of the
  members), when those that did not rejoin are dropped. A group that was EMPTY waits
  `initial_delay_s` first (Kafka's group.initial.rebalance.delay.ms), extended by each new
  member up to the rebalance timeout, so consumers starting together make one rebalance.
* Completing it bumps the generation, picks the protocol every member supports that most
  members prefer, keeps the leader if it rejoined (else the first member to join), and hands
  every member its JoinGroup answer; the leader's carries the member list.
* The leader's SyncGroup carries the assignments; every member's SyncGroup is answered with its
  own once it arrived, and the group is STABLE.
* A member that sends nothing (heartbeat, join, sync, commit) for its session timeout is
  dropped; so is a member id handed out by MEMBER_ID_REQUIRED (join v4+) and never used.

Not built: static membership (`group.instance.id` is accepted, members are treated as
dynamic) and the KIP-848 consumer protocol. Nothing here blocks or reads a clock:
`tiered.app.kafka_api.groups` waits for the answers and calls `tick` as time passes.
"""

from __future__ import annotations

import enum
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

__all__ = [
    "GroupDescription",
    "GroupSettings",
    "GroupState",
    "Groups",
    "JoinRequest",
    "JoinResult",
    "SyncResult",
]


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True)
class GroupSettings:
    """Kafka's group.* broker settings, in seconds."""

    initial_delay_s: float = 3.0
    min_session_timeout_s: float = 6.0
    max_session_timeout_s: float = 1800.0


@dataclass(frozen=True)
class JoinRequest:
    group_id: str
    member_id: str
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocol_type: str
    #: (name, metadata) in the member's order of preference
    protocols: tuple[tuple[str, bytes], ...]
    #: join v4+: a member without an id is handed one and asked to join again with it
    require_known_member: bool = False


@dataclass(frozen=True)
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    #: for the leader only: (member id, metadata of the chosen protocol)
    members: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    client_id: str
    client_host: str
    #: the member's metadata of the group's protocol (its subscription)
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupDescription:
    """What DescribeGroups and ListGroups tell of a group in memory."""

    group_id: str
    state: GroupState
    protocol_type: str
    #: the chosen protocol (assignor) once a rebalance completed, else ""
    protocol_name: str
    members: tuple[MemberDescription, ...]


@dataclass
class _Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    last_seen: float
    #: sent JoinGroup for the rebalance in progress (alive until it completes)
    joining: bool = False

    def supports(self, names: set[str]) -> bool:
        return any(name in names for name, _ in self.protocols)


@dataclass
class _Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, _Member] = field(default_factory=dict)
    #: member ids handed out by MEMBER_ID_REQUIRED -> when they lapse
    pending: dict[str, float] = field(default_factory=dict)
    #: PREPARING_REBALANCE: complete by this time whoever has rejoined
    rebalance_deadline: float = 0.0
    #: PREPARING_REBALANCE from EMPTY: do not complete before this time
    not_before: float = 0.0
    join_results: dict[str, JoinResult] = field(default_factory=dict)
    sync_results: dict[str, SyncResult] = field(default_factory=dict)
    assignments: dict[str, bytes] = field(default_factory=dict)

    def common_protocols(self) -> set[str]:
        names: set[str] | None = None
        for m in self.members.values():
            mine = {name for name, _ in m.protocols}
            names = mine if names is None else names & mine
        return names or set()


class Groups:
    """Every consumer group of the endpoint. Not thread-safe: one lock around every call
    (`tiered.app.kafka_api.groups.GroupCoordinator`). `now` is seconds on one monotonic clock.

    `join` and `sync` answer at once (an error, or a result that needs no waiting) or return
    None; the caller then polls `join_result` / `sync_result` after every change until they
    answer."""

    def __init__(self, settings: GroupSettings | None = None) -> None:
        self.settings = settings or GroupSettings()
        self._groups: dict[str, _Group] = {}

    # -- queries -------------------------------------------------------------------------

    def state(self, group_id: str) -> GroupState | None:
        g = self._groups.get(group_id)
        return None if g is None else g.state

    def generation(self, group_id: str) -> int:
        g = self._groups.get(group_id)
        return -1 if g is None else g.generation

    def members(self, group_id: str) -> list[str]:
        g = self._groups.get(group_id)
        return [] if g is None else list(g.members)

    def describe(self, group_id: str) -> GroupDescription | None:
        """The group as DescribeGroups shows it; None when this endpoint never saw it."""
        g = self._groups.get(group_id)
        if g is None:
            return None
        stable = g.state is GroupState.STABLE
        chosen = g.protocol_name or ""
        members = tuple(
            MemberDescription(m.member_id, m.client_id, m.client_host,
                              dict(m.protocols).get(chosen, b"") if chosen else b"",
                              g.assignments.get(m.member_id, b"") if stable else b"")
            for m in g.members.values())
        return GroupDescription(g.group_id, g.state, g.protocol_type or "", chosen, members)

    def group_ids(self) -> list[str]:
        """Every group this endpoint has seen (members or not), sorted."""
        return sorted(self._groups)

    def forget(self, group_id: str) -> bool:
        """Drop an EMPTY group (DeleteGroups); False when it has members (or is unknown)."""
        g = self._groups.get(group_id)
        if g is None or g.members or g.pending:
            return False
        del self._groups[group_id]
        return True

    # -- JoinGroup -----------------------------------------------------------------------

    def join(self, req: JoinRequest, now: float) -> tuple[str, JoinResult | None]:
        """Take a JoinGroup; returns the member id it is for and its answer, or None when the
        answer comes with the rebalance's completion (`join_result`)."""
        s = self.settings
        if not s.min_session_timeout_s <= req.session_timeout_s <= s.max_session_timeout_s:
            return req.member_id, JoinResult(ErrorCode.invalid_session_timeout, req.member_id)
        if not req.protocol_type or not req.protocols:
            return req.member_id, JoinResult(ErrorCode.inconsistent_group_protocol,
                                              req.member_id)
        g = self._groups.setdefault(req.group_id, _Group(req.group_id))
        if g.members and (req.protocol_type != g.protocol_type
                          or not any(name in g.common_protocols() for name, _ in req.protocols)):
            return req.member_id, JoinResult(ErrorCode.inconsistent_group_protocol,
                                              req.member_id)
        member_id = req.member_id
        if not member_id:
            member_id = f"{req.client_id or 'member'}-{uuid.uuid4()}"
            if req.require_known_member:
                g.pending[member_id] = now + req.session_timeout_s
                return member_id, JoinResult(ErrorCode.member_id_required, member_id)
        elif member_id not in g.members and member_id not in g.pending:
            return member_id, JoinResult(ErrorCode.unknown_member_id, member_id)
        g.pending.pop(member_id, None)
        old = g.members.get(member_id)
        g.join_results.pop(member_id, None)
        if (old is not None and g.state is GroupState.STABLE and member_id != g.leader
                and old.protocols == req.protocols):
            # a follower rejoining unchanged: Kafka answers with the current generation
            old.last_seen = now
            return member_id, self._join_answer(g, member_id)
        member = _Member(member_id, req.client_id, req.client_host, req.session_timeout_s,
                         req.rebalance_timeout_s, req.protocol_type, req.protocols, now,
                         joining=True)
        g.members[member_id] = member
        if g.protocol_type is None:
            g.protocol_type = req.protocol_type
        if g.state is GroupState.PREPARING_REBALANCE:
            if old is None and g.not_before > now:  # one more consumer starting with others
                g.not_before = min(now + s.initial_delay_s, g.rebalance_deadline)
        else:
            self._prepare(g, now, initial=g.state is GroupState.EMPTY)
        self._maybe_complete(g, now)
        return member_id, g.join_results.pop(member_id, None)

    def join_result(self, group_id: str, member_id: str) -> JoinResult | None:
        """The JoinGroup answer for `member_id` once its rebalance completed (or the error
        that ended its wait), else None."""
        g = self._groups.get(group_id)
        if g is None or member_id not in g.members:
            return JoinResult(ErrorCode.unknown_member_id, member_id)
        return g.join_results.pop(member_id, None)

    # -- SyncGroup -----------------------------------------------------------------------

    def sync(self, group_id: str, member_id: str, generation: int,
             assignments: Sequence[tuple[str, bytes]], now: float) -> SyncResult | None:
        """Take a SyncGroup; the answer, or None until the leader's arrives."""
        g = self._groups.get(group_id)
        error = self._member_error(g, member_id, generation)
        if error is not None or g is None:
            return SyncResult(error or ErrorCode.unknown_member_id)
        g.members[member_id].last_seen = now
        if g.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(ErrorCode.rebalance_in_progress)
        if g.state is GroupState.COMPLETING_REBALANCE and member_id == g.leader:
            given = dict(assignments)
            g.assignments = {m: given.get(m, b"") for m in g.members}
            g.state = GroupState.STABLE
            for m in g.members:
                g.sync_results[m] = self._sync_answer(g, m)
        return self.sync_result(group_id, member_id, generation)

    def sync_result(self, group_id: str, member_id: str, generation: int) -> SyncResult | None:
        g = self._groups.get(group_id)
        if g is None or member_id not in g.members:
            return SyncResult(ErrorCode.unknown_member_id)
        if generation != g.generation or g.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(ErrorCode.rebalance_in_progress)
        found = g.sync_results.pop(member_id, None)
        if found is None and g.state is GroupState.STABLE:
            return self._sync_answer(g, member_id)
        return found

    # -- Heartbeat, LeaveGroup, OffsetCommit -----------------------------------------------

    def heartbeat(self, group_id: str, member_id: str, generation: int, now: float
                  ) -> ErrorCode:
        g = self._groups.get(group_id)
        error = self._member_error(g, member_id, generation)
        if error is not None or g is None:
            return error or ErrorCode.unknown_member_id
        g.members[member_id].last_seen = now
        if g.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave(self, group_id: str, member_id: str, now: float) -> ErrorCode:
        g = self._groups.get(group_id)
        if g is None or member_id not in g.members:
            return ErrorCode.unknown_member_id
        self._remove(g, member_id, now)
        return ErrorCode.none

    def check_commit(self, group_id: str, member_id: str, generation: int, now: float
                     ) -> ErrorCode:
        """May this OffsetCommit go through? A commit with generation -1 and no member (a
        consumer that assigns its partitions itself) is allowed while the group has no
        members; otherwise the member and generation must be current."""
        g = self._groups.get(group_id)
        if generation < 0 and not member_id and (g is None or not g.members):
            return ErrorCode.none
        error = self._member_error(g, member_id, generation)
        if error is not None or g is None:
            return error or ErrorCode.unknown_member_id
        g.members[member_id].last_seen = now  # a commit shows the member is alive
        if g.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    # -- time ----------------------------------------------------------------------------

    def tick(self, now: float) -> bool:
        """Expire silent members and lapsed member ids, complete rebalances that are due;
        True if anything changed (waiters should look again)."""
        changed = False
        for g in list(self._groups.values()):
            for member_id, lapses in list(g.pending.items()):
                if lapses <= now:
                    del g.pending[member_id]
                    changed = True
            for m in list(g.members.values()):
                if not m.joining and now - m.last_seen > m.session_timeout_s:
                    self._remove(g, m.member_id, now)
                    changed = True
            if g.state is GroupState.PREPARING_REBALANCE:
                changed = self._maybe_complete(g, now) or changed
        return changed

    def next_deadline(self) -> float | None:
        """The earliest time `tick` may have something to do, None when nothing is pending."""
        times: list[float] = []
        for g in self._groups.values():
            times.extend(g.pending.values())
            times.extend(m.last_seen + m.session_timeout_s
                         for m in g.members.values() if not m.joining)
            if g.state is GroupState.PREPARING_REBALANCE:
                times.extend((g.not_before, g.rebalance_deadline))
        return min(times, default=None)

    # -- internals -----------------------------------------------------------------------

    @staticmethod
    def _member_error(g: _Group | None, member_id: str, generation: int) -> ErrorCode | None:
        if g is None or member_id not in g.members:
            return ErrorCode.unknown_member_id
        if generation != g.generation:
            return ErrorCode.illegal_generation
        return None

    def _prepare(self, g: _Group, now: float, *, initial: bool) -> None:
        g.state = GroupState.PREPARING_REBALANCE
        timeout = max((m.rebalance_timeout_s for m in g.members.values()), default=0.0)
        g.rebalance_deadline = now + timeout
        g.not_before = min(now + self.settings.initial_delay_s, g.rebalance_deadline) if (
            initial) else now
        g.sync_results.clear()
        for m in g.members.values():
            if m.joining:
                continue
            g.join_results.pop(m.member_id, None)

    def _remove(self, g: _Group, member_id: str, now: float) -> None:
        del g.members[member_id]
        g.join_results.pop(member_id, None)
        g.sync_results.pop(member_id, None)
        g.assignments.pop(member_id, None)
        if not g.members:
            self._empty(g)
        elif g.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare(g, now, initial=False)
            self._maybe_complete(g, now)
        elif g.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete(g, now)

    @staticmethod
    def _empty(g: _Group) -> None:
        if g.state is not GroupState.EMPTY:
            g.generation += 1
        g.state = GroupState.EMPTY
        g.protocol_type = g.protocol_name = g.leader = None
        g.join_results.clear()
        g.sync_results.clear()
        g.assignments.clear()

    def _maybe_complete(self, g: _Group, now: float) -> bool:
        """Complete a rebalance that is due; True if it completed (or emptied the group)."""
        if g.state is not GroupState.PREPARING_REBALANCE:
            return False
        everyone = all(m.joining for m in g.members.values()) and not g.pending
        if not ((everyone and now >= g.not_before) or now >= g.rebalance_deadline):
            return False
        for m in [m for m in g.members.values() if not m.joining]:
            del g.members[m.member_id]  # did not rejoin in time
        if not g.members:
            self._empty(g)
            return True
        g.generation += 1
        g.protocol_name = self._choose_protocol(g)
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.state = GroupState.COMPLETING_REBALANCE
        g.assignments.clear()
        for m in g.members.values():
            m.joining = False
            m.last_seen = now
            g.join_results[m.member_id] = self._join_answer(g, m.member_id)
        return True

    @staticmethod
    def _choose_protocol(g: _Group) -> str:
        common = g.common_protocols()
        votes = Counter(next(name for name, _ in m.protocols if name in common)
                        for m in g.members.values())
        return max(sorted(votes), key=lambda name: votes[name])

    @staticmethod
    def _join_answer(g: _Group, member_id: str) -> JoinResult:
        members: tuple[tuple[str, bytes], ...] = ()
        if member_id == g.leader:
            members = tuple((m.member_id, dict(m.protocols)[g.protocol_name or ""])
                            for m in g.members.values())
        return JoinResult(ErrorCode.none, member_id, g.generation, g.protocol_type,
                          g.protocol_name, g.leader or "", members)

    @staticmethod
    def _sync_answer(g: _Group, member_id: str) -> SyncResult:
        return SyncResult(ErrorCode.none, g.protocol_type, g.protocol_name,
                          g.assignments.get(member_id, b""))
