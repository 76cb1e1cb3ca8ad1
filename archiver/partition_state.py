"""The archiver's state of one partition, shared by its passes (`archiver.service`,
`archiver.remote_housekeeping`, `archiver.local_retention_pass`): the committed manifest and its
ETag as last seen, the idle timer, fencing; and the revision and writer term of a local log."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from archiver.lease_keeper import Ownership, Role
from archiver.uploader import ArchivalCursor, PartitionTarget
from manifests.commit import ManifestStore
from manifests.lease_objects import PartitionId
from tiered.errors import TieredError
from tiered.kafka.checkpoints import TopicPartition, topic_id_to_str
from tiered.kafka.local_log import PartitionLog

__all__ = ["PartitionState", "fencing_term", "revision_of", "role_of", "term_of"]


@dataclass
class PartitionState:
    """The archiver's state of one partition. `lock` guards the cursor and fencing; `log`
    and `term` are replaced whole by `scan` (a round reads them once, through `target`)."""

    log: PartitionLog
    revision: str
    term: int
    cursor: ArchivalCursor
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: the manifest term that fenced this writer; it stays out until its own term passes it
    fenced_by: int | None = None
    #: (log, head ETag, term, decision) when a round last found nothing to upload: while the
    #: scan keeps the same PartitionLog (nothing rolled, no offset moved), the head and the
    #: term are the same and no idle upload is due, the next round would decide the same
    settled: tuple[PartitionLog, str | None, int, str] | None = None
    #: the head's ETag as this process's last full housekeeping left it, when that found
    #: nothing waiting for a later pass (young orphans, a fault): while the cursor still
    #: holds that version and its copy shows nothing due, housekeeping costs no request
    housekept_etag: str | None = None
    #: when (ms) that full housekeeping ran, or the listing that made the partition's head
    #: (or a census found the partition as that housekeeping left it)
    housekept_ms: int = 0
    #: (head ETag, `listing_fingerprint`) of what the last full housekeeping judged and left,
    #: when it found nothing waiting: a census that lists the same is spared the full pass
    #: (`archiver.housekeeping_census`)
    housekept_listing: tuple[str, bytes] | None = None

    @property
    def tp(self) -> TopicPartition:
        return self.log.tp

    @functools.cached_property
    def pid(self) -> PartitionId:
        """Fixed for the state's life: a new revision is a new state (`Archiver.scan`)."""
        return PartitionId(self.log.topic, self.log.partition, self.revision)

    def target(self) -> PartitionTarget:
        return PartitionTarget(self.log, self.revision, self.term)

    def still_settled(self, role: Callable[[PartitionId], Role], now_ms: int,
                      idle_ms: int | None) -> bool:
        """Whether a round would decide what the last one did, with nothing to upload (see
        `settled`): same log, same head, same term, no idle upload due (`idle_ms`: the idle
        upload interval, None: none). `role` is asked as the round would, and only when the
        rest holds."""
        settled = self.settled
        if settled is None:
            return False
        log_, etag, term, _ = settled
        cursor = self.cursor
        if log_ is not self.log or not cursor.loaded or cursor.etag != etag:
            return False
        got = role(self.pid)
        if not got.uploader or (got.term is not None and got.term != term) or (
                got.term is None and self.term != term):
            return False
        return idle_ms is None or now_ms - cursor.last_upload_ms < idle_ms


def revision_of(part: PartitionLog) -> str:
    """The bucket revision of a partition: its topic id, or "0" when it has none."""
    return "0" if part.topic_id is None else topic_id_to_str(part.topic_id)


def term_of(part: PartitionLog) -> int:
    """The writer term: the partition's latest leader epoch (checkpoint, else the last batch)."""
    if part.leader_epochs:
        return part.leader_epochs[-1].epoch
    active = part.active_segment
    try:
        last = active.last_batch() if active is not None else None
    except (TieredError, OSError):
        last = None
    return max(0, last.partition_leader_epoch) if last is not None else 0


def fencing_term(mstore: ManifestStore, state: PartitionState) -> int:
    """The term of the head manifest that refused this writer (its own term when the head
    cannot be read)."""
    try:
        m, _ = mstore.load(state.tp.topic, state.tp.partition, state.revision)
    except TieredError:
        return state.term
    return m.term


def role_of(ownership: Ownership, state: PartitionState) -> Role:
    """This process's role for the partition; as uploader, its term becomes the writer term
    (called with the partition's lock held)."""
    role = ownership.role(state.pid)
    if role.uploader and role.term is not None:
        state.term = role.term
    return role
