"""The consumer-group APIs: JoinGroup, SyncGroup, Heartbeat, LeaveGroup (the rebalance state
machine of `coordinator.Groups`, kept in memory), OffsetCommit / OffsetFetch (committed
offsets in the bucket, `manifests.group_offsets`) and the group tools DescribeGroups,
ListGroups, DeleteGroups and OffsetDelete, docs/kafka-api.md, "Consumer groups".

`GroupCoordinator` puts one lock around the state machine. JoinGroup and SyncGroup wait on a
condition until their answer is ready, as a broker holds them; a sweeper thread advances time
(session expiry, rebalance deadlines) and wakes the waiters. Offsets are read and written
outside the lock: a slow bucket delays the committing consumer, never the group's heartbeats.

Committed offsets are bounded (docs/kafka-api.md, "Group limits"): an OffsetCommit is checked
against the topics served, Kafka's metadata limit, the groups the bucket may hold and the
partitions one group may hold, before anything is written; a collector thread applies offsets
retention every `offsets_retention_check_interval_ms`, each group decided from a fresh read.
"""

from __future__ import annotations

import datetime
import logging
import struct
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from manifests import keys
from manifests.errors import InvalidName
from manifests.group_offsets import (
    CommittedOffset,
    GroupLimitReached,
    TopicPartitionKey,
    commit_within_limits,
    delete_group,
    delete_offsets,
    expire_group_offsets,
    iter_group_objects,
    load_group_offsets,
)
from manifests.security import Operation
from tiered.app.kafka_api.context import Connection, Services
from tiered.app.kafka_api.coordinator import (
    GroupDescription,
    Groups,
    GroupSettings,
    GroupState,
    JoinRequest,
    JoinResult,
    SyncResult,
)
from tiered.app.kafka_api.messages import build, nested, response_class
from tiered.app.kafka_api.wire import Reply, Request
from tiered.errors import TieredError
from tiered.store.base import ObjectStore
from tiered.store.errors import AccessDenied
from tiered.topics import topic_name_problem

__all__ = [
    "GroupCoordinator",
    "OffsetLimits",
    "handle_delete_groups",
    "handle_describe_groups",
    "handle_heartbeat",
    "handle_join_group",
    "handle_leave_group",
    "handle_list_groups",
    "handle_offset_commit",
    "handle_offset_delete",
    "handle_offset_fetch",
    "handle_sync_group",
]

log = logging.getLogger(__name__)

(OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS,
 LIST_GROUPS, DELETE_GROUPS, OFFSET_DELETE) = 8, 9, 11, 12, 13, 14, 15, 16, 42, 47
ZERO = datetime.timedelta(0)
#: longest pause of a waiting JoinGroup / SyncGroup or of the sweeper between looks (s)
WAKE_S = 0.5
#: seconds the list of the bucket's groups is reused (group limit, ListGroups, DescribeGroups)
GROUP_LIST_TTL_S = 30.0
#: at the group limit, seconds between two listings that look for groups gone meanwhile
RECOUNT_S = 5.0
#: Kafka's group type of every group here (ListGroups v5+)
CLASSIC = "classic"


@dataclass(frozen=True)
class OffsetLimits:
    """What committed offsets may take (docs/kafka-api.md, "Group limits")."""

    #: longest OffsetCommit metadata, characters (Kafka's offset.metadata.max.bytes)
    metadata_max_chars: int = 4096
    #: groups with offsets in the bucket
    max_groups: int = 10_000
    #: partitions with an offset in one group
    max_offsets_per_group: int = 1000
    #: an offset expires this long after its commit while its group has no members
    retention_ms: int = 10080 * 60_000
    #: seconds between two collections of expired offsets
    check_interval_s: float = 600.0


@dataclass(frozen=True)
class Collected:
    """One pass of offsets retention."""

    groups: int = 0
    offsets_expired: int = 0
    groups_deleted: int = 0
    failed: int = 0


class GroupCoordinator:
    """Thread-safe groups with blocking joins and syncs, and the committed offsets in the
    bucket (`offsets`: a store handle of its own, whose writes are compare-and-swap)."""

    def __init__(self, settings: GroupSettings, offsets: ObjectStore, *,
                 limits: OffsetLimits | None = None,
                 prove_writes: Callable[[ObjectStore], object] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        """`prove_writes(offsets)` (the conditional-write probe) runs before the first commit,
        and again at the next one until it passed: commits are compare-and-swap, and a
        history server whose credentials cannot write still serves reads. `wall_clock`
        (seconds since the epoch) dates commits and decides their expiry."""
        self._groups = Groups(settings)
        self.offsets = offsets
        self.limits = limits or OffsetLimits()
        self._prove = prove_writes
        self._proven = prove_writes is None
        self._prove_lock = threading.Lock()
        self._clock = clock
        self.wall_clock = wall_clock
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._collector: threading.Thread | None = None
        self._listing_lock = threading.Lock()
        #: (when listed, the groups the bucket holds offsets for, plus those created since)
        self._listing: tuple[float, set[str]] | None = None

    def start(self) -> None:
        self._sweeper = threading.Thread(target=self._sweep, name="tiered-kafka-groups",
                                         daemon=True)
        self._sweeper.start()
        self._collector = threading.Thread(target=self._collect_loop,
                                           name="tiered-kafka-offsets-retention", daemon=True)
        self._collector.start()

    def stop(self) -> None:
        """Stop the sweeper and the collector and wake every waiter (they answer
        COORDINATOR_NOT_AVAILABLE)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for thread in (self._sweeper, self._collector):
            if thread is not None:
                thread.join()
        self._sweeper = self._collector = None

    def _sweep(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                if self._groups.tick(self._clock()):
                    self._cond.notify_all()
                due = self._groups.next_deadline()
                wait = WAKE_S if due is None else min(WAKE_S, max(0.01, due - self._clock()))
                self._cond.wait(wait)

    def _wait_for(self, answer: Callable[[], Any], stopping: threading.Event) -> Any:
        """Under the lock: call `answer` after every change until it returns something."""
        while True:
            got = answer()
            if got is not None:
                self._cond.notify_all()
                return got
            if self._stop.is_set() or stopping.is_set():
                return None
            self._cond.wait(WAKE_S)
            if self._groups.tick(self._clock()):
                self._cond.notify_all()

    def join(self, req: JoinRequest, stopping: threading.Event) -> JoinResult:
        with self._cond:
            member_id, result = self._groups.join(req, self._clock())
            self._cond.notify_all()
            if result is None:
                result = self._wait_for(
                    lambda: self._groups.join_result(req.group_id, member_id), stopping)
        return result or JoinResult(ErrorCode.coordinator_not_available, member_id)

    def sync(self, group_id: str, member_id: str, generation: int,
             assignments: Sequence[tuple[str, bytes]], stopping: threading.Event) -> SyncResult:
        with self._cond:
            result = self._groups.sync(group_id, member_id, generation, assignments,
                                       self._clock())
            self._cond.notify_all()
            if result is None:
                result = self._wait_for(
                    lambda: self._groups.sync_result(group_id, member_id, generation), stopping)
        return result or SyncResult(ErrorCode.coordinator_not_available)

    def commit(self, group_id: str, commits: Mapping[tuple[str, int], CommittedOffset]
               ) -> frozenset[TopicPartitionKey]:
        """Store `commits` in the bucket; returns the partitions refused because the group
        holds offsets for `max_offsets_per_group` partitions already. `GroupLimitReached`
        when the group is new and the bucket holds `max_groups`; TieredError when it cannot
        be done."""
        self._prove_writes()
        _stored, refused = commit_within_limits(
            self.offsets, group_id, commits, max_offsets=self.limits.max_offsets_per_group,
            may_create=lambda: self._may_create(group_id))
        return refused

    def _prove_writes(self) -> None:
        with self._prove_lock:
            if not self._proven and self._prove is not None:
                self._prove(self.offsets)
                self._proven = True

    # -- the bucket's groups -------------------------------------------------------------

    def bucket_groups(self, *, fresh: bool = False) -> set[str]:
        """The groups the bucket holds offsets for: one listing, reused for
        `GROUP_LIST_TTL_S` (and kept up to date with what this endpoint creates and
        deletes) unless `fresh`. TieredError when the bucket cannot be listed."""
        with self._listing_lock:
            return set(self._listed(fresh))

    def _listed(self, fresh: bool) -> set[str]:
        now = self._clock()
        if fresh or self._listing is None or now - self._listing[0] >= GROUP_LIST_TTL_S:
            self._listing = (now, {g for g, _info in iter_group_objects(self.offsets)})
        return self._listing[1]

    def _may_create(self, group_id: str) -> bool:
        """May the offsets of one more group be created? Counted on the reused listing; at
        the limit, listed again (at most every `RECOUNT_S`) in case groups went meanwhile."""
        with self._listing_lock:
            listed = self._listed(False)
            if len(listed - {group_id}) >= self.limits.max_groups and (
                    self._listing is not None
                    and self._clock() - self._listing[0] >= RECOUNT_S):
                listed = self._listed(True)
            if len(listed - {group_id}) >= self.limits.max_groups:
                log.warning("group %r: refused, the bucket holds the offsets of %d groups "
                            "([kafka] max_groups = %d)", group_id, len(listed),
                            self.limits.max_groups)
                return False
            listed.add(group_id)
            return True

    def _forget_listed(self, group_id: str) -> None:
        with self._listing_lock:
            if self._listing is not None:
                self._listing[1].discard(group_id)

    # -- the group tools -----------------------------------------------------------------

    def describe(self, group_id: str) -> GroupDescription | None:
        with self._cond:
            return self._groups.describe(group_id)

    def in_memory(self) -> list[GroupDescription]:
        with self._cond:
            found = (self._groups.describe(g) for g in self._groups.group_ids())
            return [d for d in found if d is not None]

    def delete_group(self, group_id: str) -> ErrorCode:
        """Kafka's DeleteGroups for one group: refused while it has members; its offsets
        leave the bucket. TieredError when the bucket fails."""
        with self._cond:
            known = self._groups.describe(group_id)
            if known is not None and known.members:
                return ErrorCode.non_empty_group
            forgotten = self._groups.forget(group_id)
        existed = delete_group(self.offsets, group_id)
        self._forget_listed(group_id)
        if existed or forgotten:
            log.info("group %r deleted (DeleteGroups)", group_id)
            return ErrorCode.none
        return ErrorCode.group_id_not_found

    def delete_offsets(self, group_id: str, partitions: Collection[TopicPartitionKey]
                       ) -> tuple[ErrorCode, dict[TopicPartitionKey, ErrorCode]]:
        """Kafka's OffsetDelete: the group's error, and each partition's. Partitions of a
        topic a member subscribes to are kept (GROUP_SUBSCRIBED_TO_TOPIC)."""
        known = self.describe(group_id)
        subscribed: set[str] | None = set()
        if known is not None and known.members:
            if known.protocol_type != "consumer":
                return ErrorCode.non_empty_group, {}
            for m in known.members:
                topics = subscription_topics(m.metadata)
                if topics is None or subscribed is None:
                    subscribed = None  # unreadable: every topic counts as subscribed
                else:
                    subscribed |= topics
        results = {tp: ErrorCode.none if subscribed is not None and tp[0] not in subscribed
                   else ErrorCode.group_subscribed_to_topic for tp in partitions}
        wanted = [tp for tp, e in results.items() if e is ErrorCode.none]
        if known is None and group_id not in self.bucket_groups():
            return ErrorCode.group_id_not_found, {}
        self._prove_writes()
        delete_offsets(self.offsets, group_id, wanted)
        return ErrorCode.none, results

    # -- offsets retention ---------------------------------------------------------------

    def _collect_loop(self) -> None:
        while not self._stop.wait(self.limits.check_interval_s):
            try:
                self.collect_expired()
            except TieredError as exc:
                log.warning("offsets retention: the bucket's groups cannot be listed (%s); "
                            "trying again in %.0f s", exc, self.limits.check_interval_s)
            except Exception:
                log.exception("offsets retention failed; trying again in %.0f s",
                              self.limits.check_interval_s)

    def collect_expired(self, now_ms: int | None = None) -> Collected:
        """One pass of offsets retention over every group of the bucket without members
        here: offsets committed `retention_ms` or longer before `now_ms` go, a group left
        with none is deleted. Each group is decided from a fresh read of its object and
        written by compare-and-swap (a commit landing meanwhile wins, and the decision is
        made again). TieredError when the bucket cannot be listed."""
        if now_ms is None:
            now_ms = int(self.wall_clock() * 1000)
        cutoff = now_ms - self.limits.retention_ms
        groups = expired = deleted = failed = 0
        for group in sorted(self.bucket_groups(fresh=True)):
            if self._stop.is_set():
                break
            known = self.describe(group)
            if known is not None and known.members:
                continue  # Kafka keeps the offsets of a group while it has members
            groups += 1
            try:
                dropped, gone = expire_group_offsets(
                    self.offsets, group, lambda c: c.commit_timestamp <= cutoff)
            except AccessDenied as exc:  # read-only credentials: one line, not one per group
                log.warning("offsets retention: the bucket refuses changes to committed offsets "
                            "(%s); nothing collected", exc)
                failed += 1
                break
            except TieredError as exc:
                failed += 1
                log.warning("offsets retention: group %r: %s", group, exc)
                continue
            expired += dropped
            if gone:
                deleted += 1
                self._forget_listed(group)
                with self._cond:
                    self._groups.forget(group)
            if dropped or gone:
                log.info("offsets retention: group %r: %d offset(s) expired%s", group,
                         dropped, ", group deleted" if gone else "")
        return Collected(groups, expired, deleted, failed)

    def heartbeat(self, group_id: str, member_id: str, generation: int) -> ErrorCode:
        with self._cond:
            return self._groups.heartbeat(group_id, member_id, generation, self._clock())

    def leave(self, group_id: str, member_id: str) -> ErrorCode:
        with self._cond:
            error = self._groups.leave(group_id, member_id, self._clock())
            self._cond.notify_all()
            return error

    def check_commit(self, group_id: str, member_id: str, generation: int) -> ErrorCode:
        with self._cond:
            return self._groups.check_commit(group_id, member_id, generation, self._clock())


def _group_error(group_id: str) -> ErrorCode | None:
    try:
        keys.group_key_component(group_id)
    except InvalidName:
        return ErrorCode.invalid_group_id
    return None


def _refused(svc: Services, conn: Connection, group_id: str,
             operation: Operation = Operation.READ) -> ErrorCode | None:
    """GROUP_AUTHORIZATION_FAILED when the connection's principal may not do `operation` on
    the group (docs/security.md)."""
    if svc.guard.group(conn, operation, group_id):
        return None
    return ErrorCode.group_authorization_failed


def _store_error(exc: TieredError, what: str) -> ErrorCode:
    """Kafka's code for committed offsets the bucket could not read or write."""
    if isinstance(exc, AccessDenied):
        log.error("%s: the bucket refuses committed offsets (%s): the credentials need read "
                  "and write access to %s", what, exc, keys.GROUPS_PREFIX)
        return ErrorCode.group_authorization_failed
    log.warning("%s: committed offsets unavailable: %s", what, exc)
    return ErrorCode.coordinator_not_available


# --- JoinGroup, SyncGroup, Heartbeat, LeaveGroup ---------------------------------------------


def handle_join_group(svc: Services, conn: Connection, req: Request) -> Reply:
    body, v = req.body, req.api_version
    cls = response_class(JOIN_GROUP, v)
    error = _group_error(body.group_id) or _refused(svc, conn, body.group_id)
    if error is not None:
        result = JoinResult(error, body.member_id)
    else:
        session = body.session_timeout.total_seconds()
        rebalance = getattr(body, "rebalance_timeout", body.session_timeout).total_seconds()
        result = svc.groups.join(JoinRequest(
            body.group_id, body.member_id, req.client_id or "", conn.peer_host, session,
            rebalance, body.protocol_type,
            tuple((p.name, bytes(p.metadata)) for p in body.protocols),
            require_known_member=v >= 4), svc.stopping)
    member_cls = nested(cls, "JoinGroupResponseMember")
    members = tuple(build(member_cls, member_id=m, group_instance_id=None, metadata=meta)
                    for m, meta in result.members)
    return Reply.of(req.correlation_id, build(
        cls, throttle_time=ZERO, error_code=result.error, generation_id=result.generation,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name if v >= 7 else (result.protocol_name or ""),
        leader=result.leader, skip_assignment=False, member_id=result.member_id,
        members=members))


def handle_sync_group(svc: Services, conn: Connection, req: Request) -> Reply:
    body = req.body
    cls = response_class(SYNC_GROUP, req.api_version)
    error = _group_error(body.group_id) or _refused(svc, conn, body.group_id)
    if error is not None:
        result = SyncResult(error)
    else:
        result = svc.groups.sync(
            body.group_id, body.member_id, body.generation_id,
            [(a.member_id, bytes(a.assignment)) for a in body.assignments], svc.stopping)
    return Reply.of(req.correlation_id, build(
        cls, throttle_time=ZERO, error_code=result.error, protocol_type=result.protocol_type,
        protocol_name=result.protocol_name, assignment=result.assignment))


def handle_heartbeat(svc: Services, conn: Connection, req: Request) -> Reply:
    body = req.body
    error = (_group_error(body.group_id) or _refused(svc, conn, body.group_id)
             or svc.groups.heartbeat(body.group_id, body.member_id, body.generation_id))
    return Reply.of(req.correlation_id, build(response_class(HEARTBEAT, req.api_version),
                                              throttle_time=ZERO, error_code=error))


def handle_leave_group(svc: Services, conn: Connection, req: Request) -> Reply:
    body, v = req.body, req.api_version
    cls = response_class(LEAVE_GROUP, v)
    bad = _group_error(body.group_id) or _refused(svc, conn, body.group_id)
    if v < 3:
        error = bad or svc.groups.leave(body.group_id, body.member_id)
        return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, error_code=error))
    member_cls = nested(cls, "MemberResponse")
    members = []
    for m in body.members:
        error = bad or svc.groups.leave(body.group_id, m.member_id)
        members.append(build(member_cls, member_id=m.member_id,
                             group_instance_id=m.group_instance_id, error_code=error))
    return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO,
                                              error_code=bad or ErrorCode.none,
                                              members=tuple(members)))


# --- OffsetCommit, OffsetFetch -----------------------------------------------------------------


def served_partitions(svc: Services, topic: str) -> int | None:
    """How many partitions the endpoint serves of `topic`; None when it serves no such topic.
    The one place the group APIs learn about topics. TieredError when it cannot be told."""
    found = svc.catalog.topic(topic)
    return None if found is None else found.partitions


def handle_offset_commit(svc: Services, conn: Connection, req: Request) -> Reply:
    body = req.body
    cls = response_class(OFFSET_COMMIT, req.api_version)
    group = body.group_id
    generation = getattr(body, "generation_id_or_member_epoch", None)
    if generation is None:
        generation = body.generation_id
    error = (_group_error(group) or _refused(svc, conn, group)
             or svc.groups.check_commit(group, body.member_id, generation))
    now_ms = int(svc.wall_clock() * 1000)
    max_metadata = svc.groups.limits.metadata_max_chars
    results: dict[tuple[str, int], ErrorCode] = {}
    commits: dict[tuple[str, int], CommittedOffset] = {}
    counts: dict[str, int | None | ErrorCode] = {}  # topic -> partitions served, or why not
    for t in body.topics:
        if error is ErrorCode.none and t.name not in counts:
            counts[t.name] = (_topic_partitions(svc, t.name)
                              if svc.guard.topic(conn, Operation.READ, t.name)
                              else ErrorCode.topic_authorization_failed)
        count = counts.get(t.name)
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            metadata = p.committed_metadata
            if error is not ErrorCode.none:
                results[tp] = error
            elif isinstance(count, ErrorCode):
                results[tp] = count
            elif count is None or not 0 <= p.partition_index < count:
                results[tp] = ErrorCode.unknown_topic_or_partition
            elif p.committed_offset < -1:
                results[tp] = ErrorCode.offset_out_of_range
            elif metadata is not None and len(metadata) > max_metadata:
                results[tp] = ErrorCode.offset_metadata_too_large
            else:
                commits[tp] = CommittedOffset(p.committed_offset,
                                              getattr(p, "committed_leader_epoch", -1),
                                              metadata, now_ms)
    if commits:
        results.update(_store_commits(svc, group, commits))
    part_cls = nested(cls, "OffsetCommitResponsePartition")
    topics = []
    for t in body.topics:
        parts = tuple(build(part_cls, partition_index=p.partition_index,
                            error_code=results[(t.name, p.partition_index)])
                      for p in t.partitions)
        topics.append(build(nested(cls, "OffsetCommitResponseTopic"), name=t.name,
                            partitions=parts))
    return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, topics=tuple(topics)))


def _topic_partitions(svc: Services, name: str) -> int | None | ErrorCode:
    """Partitions served of topic `name` (None: no such topic), or the error to answer."""
    if topic_name_problem(name) is not None:
        return ErrorCode.invalid_topic_exception
    try:
        return served_partitions(svc, name)
    except TieredError as exc:
        log.warning("OffsetCommit for topic %r: cannot tell whether it exists: %s", name, exc)
        return ErrorCode.coordinator_not_available


def _store_commits(svc: Services, group: str, commits: Mapping[tuple[str, int], CommittedOffset]
                   ) -> dict[tuple[str, int], ErrorCode]:
    try:
        refused = svc.groups.commit(group, commits)
    except GroupLimitReached:
        return dict.fromkeys(commits, ErrorCode.policy_violation)
    except TieredError as exc:
        return dict.fromkeys(commits, _store_error(exc, f"group {group!r}"))
    if refused:
        log.warning("group %r: %d partition(s) refused: the group holds offsets for %d "
                    "partitions ([kafka] max_offsets_per_group)", group, len(refused),
                    svc.groups.limits.max_offsets_per_group)
    return {tp: ErrorCode.invalid_commit_offset_size if tp in refused else ErrorCode.none
            for tp in commits}


def handle_offset_fetch(svc: Services, conn: Connection, req: Request) -> Reply:
    body, v = req.body, req.api_version
    cls = response_class(OFFSET_FETCH, v)
    if v >= 8:
        groups = tuple(_group_answer(svc, conn, cls, g.group_id, g.topics, grouped=True)
                       for g in body.groups)
        return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, groups=groups))
    answer = _group_answer(svc, conn, cls, body.group_id, body.topics, grouped=False)
    return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, **answer))


def _group_answer(svc: Services, conn: Connection, cls: type[Any], group: str, wanted: Any, *,
                  grouped: bool) -> Any:
    """One group's committed offsets: those asked for (-1 where nothing was committed), or
    every one when `wanted` is null."""
    suffix = "s" if grouped else ""
    topic_cls = nested(cls, "OffsetFetchResponseTopic" + suffix)
    part_cls = nested(cls, "OffsetFetchResponsePartition" + suffix)
    error = _group_error(group) or _refused(svc, conn, group)
    committed: Mapping[tuple[str, int], CommittedOffset] = {}
    if error is None:
        try:
            committed = load_group_offsets(svc.groups.offsets, group)[0].offsets
        except TieredError as exc:
            error = _store_error(exc, f"group {group!r}")
    if wanted is None:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in committed:
            by_topic.setdefault(topic, []).append(partition)
        asked = list(by_topic.items())
    else:
        asked = [(t.name, list(t.partition_indexes)) for t in wanted]
    topics = []
    for name, partitions in asked:
        parts = []
        for p in partitions:
            c = committed.get((name, p))
            parts.append(build(
                part_cls, partition_index=p, committed_offset=-1 if c is None else c.offset,
                committed_leader_epoch=-1 if c is None else c.leader_epoch,
                metadata="" if c is None else c.metadata,
                error_code=ErrorCode.none if error is None else error))
        topics.append(build(topic_cls, name=name, partitions=tuple(parts)))
    fields = {"topics": tuple(topics), "error_code": error or ErrorCode.none}
    if grouped:
        return build(nested(cls, "OffsetFetchResponseGroup"), group_id=group, **fields)
    return fields


# --- DescribeGroups, ListGroups, DeleteGroups, OffsetDelete -----------------------------------


def subscription_topics(metadata: bytes) -> set[str] | None:
    """The topics of a consumer's subscription (the member metadata of the "consumer"
    protocol: version, then an array of topic names); None when it does not parse."""
    try:
        _version, count = struct.unpack_from(">hi", metadata, 0)
        if not 0 <= count <= len(metadata):
            return None
        pos, topics = 6, set()
        for _ in range(count):
            (size,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if size < 0 or pos + size > len(metadata):
                return None
            topics.add(metadata[pos:pos + size].decode("utf-8"))
            pos += size
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


def handle_describe_groups(svc: Services, conn: Connection, req: Request) -> Reply:
    cls = response_class(DESCRIBE_GROUPS, req.api_version)
    group_cls = nested(cls, "DescribedGroup")
    member_cls = nested(cls, "DescribedGroupMember")
    listed: set[str] | None = None
    groups = []
    for group_id in req.body.groups:
        error = _group_error(group_id) or _refused(svc, conn, group_id, Operation.DESCRIBE)
        known = None if error is not None else svc.groups.describe(group_id)
        state = GroupState.EMPTY.value
        if error is None and known is None:
            # not seen here: Empty when the bucket has its offsets, else Kafka's Dead
            try:
                if listed is None:
                    listed = svc.groups.bucket_groups()
                if group_id not in listed:
                    state = "Dead"
            except TieredError as exc:
                error = _store_error(exc, f"group {group_id!r}")
        members = () if known is None else tuple(
            build(member_cls, member_id=m.member_id, group_instance_id=None,
                  client_id=m.client_id, client_host=m.client_host, member_metadata=m.metadata,
                  member_assignment=m.assignment) for m in known.members)
        groups.append(build(
            group_cls, error_code=error or ErrorCode.none, error_message=None,
            group_id=group_id, group_state=state if known is None else known.state.value,
            protocol_type="" if known is None else known.protocol_type,
            protocol_data="" if known is None else known.protocol_name, members=members,
            authorized_operations=-2**31))
    return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, groups=tuple(groups)))


def handle_list_groups(svc: Services, conn: Connection, req: Request) -> Reply:
    body = req.body
    cls = response_class(LIST_GROUPS, req.api_version)
    error = ErrorCode.none
    found: dict[str, tuple[str, str]] = {}  # group -> (state, protocol type)
    try:
        found = {g: (GroupState.EMPTY.value, "") for g in svc.groups.bucket_groups()}
    except TieredError as exc:
        error = _store_error(exc, "ListGroups")
    for d in svc.groups.in_memory():
        found[d.group_id] = (d.state.value, d.protocol_type)
    found = {g: v for g, v in found.items() if svc.guard.group(conn, Operation.DESCRIBE, g)}
    states = {s.lower() for s in getattr(body, "states_filter", ())}
    types = {t.lower() for t in getattr(body, "types_filter", ())}
    if types and CLASSIC not in types:
        found = {}
    listed_cls = nested(cls, "ListedGroup")
    groups = tuple(build(listed_cls, group_id=g, protocol_type=ptype, group_state=state,
                         group_type=CLASSIC)
                   for g, (state, ptype) in sorted(found.items())
                   if not states or state.lower() in states)
    return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, error_code=error,
                                              groups=groups))


def handle_delete_groups(svc: Services, conn: Connection, req: Request) -> Reply:
    cls = response_class(DELETE_GROUPS, req.api_version)
    result_cls = nested(cls, "DeletableGroupResult")
    results = []
    for group_id in req.body.groups_names:
        error = _group_error(group_id) or _refused(svc, conn, group_id, Operation.DELETE)
        if error is None:
            try:
                error = svc.groups.delete_group(group_id)
            except TieredError as exc:
                error = _store_error(exc, f"group {group_id!r}")
        results.append(build(result_cls, group_id=group_id, error_code=error))
    return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, results=tuple(results)))


def handle_offset_delete(svc: Services, conn: Connection, req: Request) -> Reply:
    body = req.body
    cls = response_class(OFFSET_DELETE, req.api_version)
    asked = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]
    error = _group_error(body.group_id) or _refused(svc, conn, body.group_id, Operation.DELETE)
    per_partition: dict[TopicPartitionKey, ErrorCode] = {}
    if error is None:
        try:
            error, per_partition = svc.groups.delete_offsets(body.group_id, asked)
        except TieredError as exc:
            error = _store_error(exc, f"group {body.group_id!r}")
    if error is not ErrorCode.none:
        return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, error_code=error))
    part_cls = nested(cls, "OffsetDeleteResponsePartition")
    topics = tuple(build(nested(cls, "OffsetDeleteResponseTopic"), name=t.name, partitions=tuple(
        build(part_cls, partition_index=p.partition_index,
              error_code=per_partition.get((t.name, p.partition_index), ErrorCode.none))
        for p in t.partitions)) for t in body.topics)
    return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, error_code=error,
                                              topics=topics))
