"""The consumer-group APIs: JoinGroup, SyncGroup, Heartbeat, LeaveGroup (the rebalance state
machine of `coordinator.Groups`, kept in memory) and OffsetCommit / OffsetFetch (committed
offsets in the bucket, `manifests.group_offsets`), docs/kafka-api.md, "Consumer groups".

`GroupCoordinator` puts one lock around the state machine. JoinGroup and SyncGroup wait on a
condition until their answer is ready, as a broker holds them; a sweeper thread advances time
(session expiry, rebalance deadlines) and wakes the waiters. Offsets are read and written
outside the lock: a slow bucket delays the committing consumer, never the group's heartbeats.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from manifests import keys
from manifests.errors import InvalidName
from manifests.group_offsets import (
    MAX_METADATA_CHARS,
    CommittedOffset,
    commit_group_offsets,
    load_group_offsets,
)
from tiered.app.kafka_api.context import Connection, Services
from tiered.app.kafka_api.coordinator import (
    Groups,
    GroupSettings,
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
    "handle_heartbeat",
    "handle_join_group",
    "handle_leave_group",
    "handle_offset_commit",
    "handle_offset_fetch",
    "handle_sync_group",
]

log = logging.getLogger(__name__)

OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 11, 12, 13, 14
ZERO = datetime.timedelta(0)
#: longest pause of a waiting JoinGroup / SyncGroup or of the sweeper between looks (s)
WAKE_S = 0.5


class GroupCoordinator:
    """Thread-safe groups with blocking joins and syncs, and the committed offsets in the
    bucket (`offsets`: a store handle of its own, whose writes are compare-and-swap)."""

    def __init__(self, settings: GroupSettings, offsets: ObjectStore, *,
                 prove_writes: Callable[[ObjectStore], object] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`prove_writes(offsets)` (the conditional-write probe) runs before the first commit,
        and again at the next one until it passed: commits are compare-and-swap, and a
        history server whose credentials cannot write still serves reads."""
        self._groups = Groups(settings)
        self.offsets = offsets
        self._prove = prove_writes
        self._proven = prove_writes is None
        self._prove_lock = threading.Lock()
        self._clock = clock
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    def start(self) -> None:
        self._sweeper = threading.Thread(target=self._sweep, name="tiered-kafka-groups",
                                         daemon=True)
        self._sweeper.start()

    def stop(self) -> None:
        """Stop the sweeper and wake every waiter (they answer COORDINATOR_NOT_AVAILABLE)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._sweeper is not None:
            self._sweeper.join()
            self._sweeper = None

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

    def commit(self, group_id: str, commits: Mapping[tuple[str, int], CommittedOffset]) -> None:
        """Store `commits` in the bucket (TieredError when it cannot be done)."""
        with self._prove_lock:
            if not self._proven and self._prove is not None:
                self._prove(self.offsets)
                self._proven = True
        commit_group_offsets(self.offsets, group_id, commits)

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
    error = _group_error(body.group_id)
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
    error = _group_error(body.group_id)
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
    error = _group_error(body.group_id) or svc.groups.heartbeat(
        body.group_id, body.member_id, body.generation_id)
    return Reply.of(req.correlation_id, build(response_class(HEARTBEAT, req.api_version),
                                              throttle_time=ZERO, error_code=error))


def handle_leave_group(svc: Services, conn: Connection, req: Request) -> Reply:
    body, v = req.body, req.api_version
    cls = response_class(LEAVE_GROUP, v)
    bad = _group_error(body.group_id)
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


def handle_offset_commit(svc: Services, conn: Connection, req: Request) -> Reply:
    body = req.body
    cls = response_class(OFFSET_COMMIT, req.api_version)
    group = body.group_id
    generation = getattr(body, "generation_id_or_member_epoch", None)
    if generation is None:
        generation = body.generation_id
    error = _group_error(group) or svc.groups.check_commit(group, body.member_id, generation)
    now_ms = int(svc.wall_clock() * 1000)
    results: dict[tuple[str, int], ErrorCode] = {}
    commits: dict[tuple[str, int], CommittedOffset] = {}
    for t in body.topics:
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            metadata = p.committed_metadata
            if error is not ErrorCode.none:
                results[tp] = error
            elif topic_name_problem(t.name) is not None:
                results[tp] = ErrorCode.invalid_topic_exception
            elif not 0 <= p.partition_index <= keys.MAX_PARTITION:
                results[tp] = ErrorCode.unknown_topic_or_partition
            elif metadata is not None and len(metadata) > MAX_METADATA_CHARS:
                results[tp] = ErrorCode.offset_metadata_too_large
            else:
                commits[tp] = CommittedOffset(p.committed_offset,
                                              getattr(p, "committed_leader_epoch", -1),
                                              metadata, now_ms)
    if commits:
        try:
            svc.groups.commit(group, commits)
            stored = ErrorCode.none
        except TieredError as exc:
            stored = _store_error(exc, f"group {group!r}")
        results.update(dict.fromkeys(commits, stored))
    part_cls = nested(cls, "OffsetCommitResponsePartition")
    topics = []
    for t in body.topics:
        parts = tuple(build(part_cls, partition_index=p.partition_index,
                            error_code=results[(t.name, p.partition_index)])
                      for p in t.partitions)
        topics.append(build(nested(cls, "OffsetCommitResponseTopic"), name=t.name,
                            partitions=parts))
    return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, topics=tuple(topics)))


def handle_offset_fetch(svc: Services, conn: Connection, req: Request) -> Reply:
    body, v = req.body, req.api_version
    cls = response_class(OFFSET_FETCH, v)
    if v >= 8:
        groups = tuple(_group_answer(svc, cls, g.group_id, g.topics, grouped=True)
                       for g in body.groups)
        return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, groups=groups))
    answer = _group_answer(svc, cls, body.group_id, body.topics, grouped=False)
    return Reply.of(req.correlation_id, build(cls, throttle_time=ZERO, **answer))


def _group_answer(svc: Services, cls: type[Any], group: str, wanted: Any, *, grouped: bool
                  ) -> Any:
    """One group's committed offsets: those asked for (-1 where nothing was committed), or
    every one when `wanted` is null."""
    suffix = "s" if grouped else ""
    topic_cls = nested(cls, "OffsetFetchResponseTopic" + suffix)
    part_cls = nested(cls, "OffsetFetchResponsePartition" + suffix)
    error = _group_error(group)
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
