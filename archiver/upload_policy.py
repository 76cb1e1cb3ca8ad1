"""Upload candidate selection: which local data the archiver uploads next, as a pure function.

The policy sees a snapshot of one partition's local log (`LogSnapshot`: closed segments, the
active segment, high watermark / last stable offset) and what the archiver knows
(`ArchivalState`: the committed manifest's last offset, when it last uploaded), and returns an
`UploadPlan`. It reads no file and no clock; the archiver does the I/O around it.

Rules (design invariant 3, Redpanda's "Remote write" / "Idle timeout"):

* only closed segments whose last offset is below the stable end (min of high watermark and
  last stable offset, both exclusive) are uploaded, oldest first, at most
  `UploadParams.max_candidates_per_round` per round;
* the active segment never, except the idle-timeout upload of its stable prefix: whole batches
  below the stable end, once `cloud_storage_segment_max_upload_interval_sec` has passed since
  the last upload;
* uploads continue the manifest exactly at `manifest_last_offset + 1` (design invariant 4); when the
  next local data starts later, that is a `GAP` (local retention removed data before it was
  uploaded), reported as a value, never skipped over silently.

Expected "nothing to do" outcomes are `UploadDecision` values with a log level each
(`DECISION_LOG_LEVEL`); exceptions are only for malformed input (`PolicyInputError`).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tiered.errors import ConfigError, TieredError


class PolicyInputError(TieredError, ValueError):
    """The data handed to a pure archiver policy is inconsistent (overlapping segments, a
    negative size, ...): a bug in whoever built the view, or a damaged log directory. The
    daemon reports it for that partition and keeps serving the others (design invariant 9)."""


@dataclass(frozen=True, slots=True)
class LocalSegment:
    """A closed segment of the local log, as the write path needs to know it.

    `last_offset` is the last offset of its last batch; a segment with no batches has
    `last_offset == base_offset - 1`. `max_timestamp_ms` is the largest batch timestamp in it
    (the caller falls back to the file's mtime when the segment has none, as Kafka does).
    `paths` are its files (``.log`` first, then ``.index`` / ``.timeindex``), carried through
    untouched so the caller acts on exactly the files the policy chose.
    """

    base_offset: int
    last_offset: int
    size_bytes: int
    max_timestamp_ms: int
    paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.base_offset < 0:
            raise PolicyInputError(f"segment base offset {self.base_offset} is negative")
        if self.last_offset < self.base_offset - 1:
            raise PolicyInputError(
                f"segment {self.base_offset}: last offset {self.last_offset} is below its base"
            )
        if self.size_bytes < 0:
            raise PolicyInputError(f"segment {self.base_offset}: negative size {self.size_bytes}")

    @property
    def begin_inclusive(self) -> int:
        return self.base_offset

    @property
    def end_exclusive(self) -> int:
        return self.last_offset + 1

    @property
    def is_empty(self) -> bool:
        """True when the segment holds no offsets at all (Kafka can roll an empty segment)."""
        return self.last_offset < self.base_offset


@dataclass(frozen=True, slots=True)
class ActiveSegment:
    """The segment the broker is appending to: never deleted, uploaded only by idle timeout."""

    base_offset: int
    size_bytes: int
    paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.base_offset < 0 or self.size_bytes < 0:
            raise PolicyInputError(
                f"active segment: base offset {self.base_offset} and size {self.size_bytes} "
                "must not be negative"
            )


class BatchSpan(Protocol):
    """Where one record batch sits in a segment file. `tiered.kafka.records.BatchHeader` has exactly
    these attributes, so the caller can pass the headers it walked; `BatchBoundary` is the
    plain-data version."""

    @property
    def position(self) -> int: ...  # byte offset of the batch's first byte in the file
    @property
    def size(self) -> int: ...  # bytes the whole batch takes on disk
    @property
    def base_offset(self) -> int: ...
    @property
    def last_offset(self) -> int: ...
    @property
    def max_timestamp(self) -> int: ...  # ms since the epoch


@dataclass(frozen=True, slots=True)
class BatchBoundary:
    """A `BatchSpan` as plain data (tests, and callers that did not keep the headers)."""

    position: int
    size: int
    base_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class LogSnapshot:
    """One partition's local log at one instant, as the upload policy needs it.

    `high_watermark` and `last_stable_offset` are exclusive bounds (Kafka's convention: the
    offset of the next record); `last_stable_offset` is None for a partition without
    transactions, where it equals the high watermark."""

    closed: tuple[LocalSegment, ...]
    active: ActiveSegment | None
    high_watermark: int
    last_stable_offset: int | None = None

    def __post_init__(self) -> None:
        check_log_layout(self.closed, None if self.active is None else self.active.base_offset)
        if self.high_watermark < 0:
            raise PolicyInputError(f"high watermark {self.high_watermark} is negative")
        if self.last_stable_offset is not None and self.last_stable_offset < 0:
            raise PolicyInputError(f"last stable offset {self.last_stable_offset} is negative")

    @property
    def stable_end_exclusive(self) -> int:
        """First offset that may not be uploaded yet: consumers cannot read it either."""
        if self.last_stable_offset is None:
            return self.high_watermark
        return min(self.high_watermark, self.last_stable_offset)


@dataclass(frozen=True, slots=True)
class ArchivalState:
    """What the archiver knows about one partition between rounds.

    `manifest_last_offset` is the last offset of the committed manifest (None while it is
    empty); `last_upload_ms` is when the last upload for the partition finished, or when the
    archiver took the partition over (the idle timer starts there)."""

    manifest_last_offset: int | None
    last_upload_ms: int
    #: a compacted topic whose local log start is at or below the manifest's next offset: the
    #: offsets missing between the manifest and the local data were removed by the broker's
    #: cleaner, not by retention, so uploads continue the manifest across them (the object's
    #: range starts at the manifest's next offset, its first batch later; docs/compaction.md)
    compaction_holes: bool = False


@dataclass(frozen=True, slots=True)
class UploadParams:
    """Configuration of candidate selection; validates itself when built."""

    #: `cloud_storage_segment_max_upload_interval_sec`; None (the default) disables idle uploads
    segment_max_upload_interval_sec: int | None = None
    #: segments (or prefixes) picked per round; tiered's own knob, Redpanda names none
    max_candidates_per_round: int = 8

    def __post_init__(self) -> None:
        interval = self.segment_max_upload_interval_sec
        if interval is not None and (isinstance(interval, bool) or interval < 1):
            raise ConfigError(
                "cloud_storage_segment_max_upload_interval_sec: must be at least 1 second or "
                f"unset, got {interval!r}"
            )
        if isinstance(self.max_candidates_per_round, bool) or self.max_candidates_per_round < 1:
            raise ConfigError(
                f"max candidates per round must be at least 1, got {self.max_candidates_per_round}"
            )

    @classmethod
    def from_cluster(
        cls, values: Mapping[str, object], *, max_candidates_per_round: int = 8
    ) -> UploadParams:
        """Build from parsed cluster properties (missing keys take Redpanda's default)."""
        raw = values.get("cloud_storage_segment_max_upload_interval_sec")
        if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int)):
            raise ConfigError(
                f"cloud_storage_segment_max_upload_interval_sec: expected an integer, got {raw!r}"
            )
        return cls(raw, max_candidates_per_round)

    @property
    def idle_interval_ms(self) -> int | None:
        sec = self.segment_max_upload_interval_sec
        return None if sec is None else sec * 1000


class UploadKind(enum.Enum):
    #: a whole closed segment: bytes [0, size)
    SEGMENT = "segment"
    #: the rest of a closed segment whose head an idle-timeout upload already covered; the
    #: caller finds the byte position of `begin_inclusive` with the segment's offset index
    SEGMENT_SUFFIX = "segment_suffix"
    #: idle timeout: whole batches of the active segment below the stable end
    STABLE_PREFIX = "stable_prefix"


@dataclass(frozen=True, slots=True)
class UploadCandidate:
    """One object to upload: offsets [begin_inclusive, end_exclusive) of the segment based at
    `segment_base_offset`, bytes [byte_begin_inclusive, byte_end_exclusive) of its file
    (`byte_begin_inclusive` None: look it up, see `UploadKind.SEGMENT_SUFFIX`)."""

    kind: UploadKind
    segment_base_offset: int
    begin_inclusive: int
    end_exclusive: int
    byte_begin_inclusive: int | None
    byte_end_exclusive: int
    max_timestamp_ms: int
    paths: tuple[str, ...]
    #: the first batch may start after `begin_inclusive` (compaction's holes, see
    #: `ArchivalState.compaction_holes`)
    holes: bool = False

    @property
    def last_offset(self) -> int:
        return self.end_exclusive - 1


class UploadDecision(enum.Enum):
    #: `candidates` holds what to upload, oldest first
    UPLOAD = "upload"
    #: the manifest covers all local data; nothing to do
    UP_TO_DATE = "up_to_date"
    #: there is data past the manifest, but none uploadable yet (active segment or not stable)
    WAIT = "wait"
    #: the idle timeout is due: call again with the active segment's batch boundaries
    NEEDS_ACTIVE_BATCHES = "needs_active_batches"
    #: local data resumes after the manifest's next offset; see `UploadPlan.gap`
    GAP = "gap"
    #: the manifest's last offset falls inside a local batch: whole-batch uploads would overlap
    OVERLAP = "overlap"
    #: the manifest claims offsets at or beyond the local high watermark
    MANIFEST_AHEAD = "manifest_ahead"


#: how loudly the archiver logs each outcome (Redpanda maps its candidate errors the same way)
DECISION_LOG_LEVEL: dict[UploadDecision, int] = {
    UploadDecision.UPLOAD: logging.DEBUG,
    UploadDecision.UP_TO_DATE: logging.DEBUG,
    UploadDecision.WAIT: logging.DEBUG,
    UploadDecision.NEEDS_ACTIVE_BATCHES: logging.DEBUG,
    UploadDecision.GAP: logging.WARNING,
    UploadDecision.OVERLAP: logging.ERROR,
    UploadDecision.MANIFEST_AHEAD: logging.WARNING,
}


@dataclass(frozen=True, slots=True)
class Gap:
    """Offsets [expected_begin_inclusive, found_begin_inclusive) are neither in the manifest
    nor on local disk."""

    expected_begin_inclusive: int
    found_begin_inclusive: int

    @property
    def missing_offsets(self) -> int:
        return self.found_begin_inclusive - self.expected_begin_inclusive


@dataclass(frozen=True, slots=True)
class UploadPlan:
    decision: UploadDecision
    candidates: tuple[UploadCandidate, ...] = ()
    gap: Gap | None = None
    #: one line for the log: why this decision
    detail: str = ""


def idle_upload_due(
    log: LogSnapshot, state: ArchivalState, params: UploadParams, now_ms: int
) -> bool:
    """True when the idle timeout asks for the active segment's stable prefix: the interval is
    set, it has passed since the last upload, and the active segment may hold stable data past
    the manifest. The caller reads the active segment's batch headers only then."""
    interval = params.idle_interval_ms
    if interval is None or log.active is None or log.active.size_bytes == 0:
        return False
    if now_ms - state.last_upload_ms < interval:
        return False
    uploaded_end = -1 if state.manifest_last_offset is None else state.manifest_last_offset
    first_unuploaded = max(log.active.base_offset, uploaded_end + 1)
    return first_unuploaded < log.stable_end_exclusive


def plan_uploads(
    log: LogSnapshot,
    state: ArchivalState,
    params: UploadParams,
    now_ms: int,
    active_batches: Sequence[BatchSpan] = (),
) -> UploadPlan:
    """What to upload next for one partition (see the module docstring for the rules).

    `active_batches` are the active segment's batches in file order; they are needed only when
    `idle_upload_due` is true, and the plan says `NEEDS_ACTIVE_BATCHES` if they are missing."""
    manifest_last = state.manifest_last_offset
    stable_end = log.stable_end_exclusive
    if manifest_last is not None and manifest_last >= log.high_watermark:
        return UploadPlan(
            UploadDecision.MANIFEST_AHEAD,
            detail=f"manifest ends at {manifest_last}, local high watermark is "
            f"{log.high_watermark}",
        )

    expected = None if manifest_last is None else manifest_last + 1
    candidates: list[UploadCandidate] = []
    pending_closed = False  # a closed segment past the manifest is left for a later round
    for seg in log.closed:
        if seg.is_empty or (manifest_last is not None and seg.last_offset <= manifest_last):
            continue
        if len(candidates) == params.max_candidates_per_round or seg.last_offset >= stable_end:
            pending_closed = True
            break
        if expected is not None and seg.base_offset > expected and not state.compaction_holes:
            if candidates:  # upload the contiguous run; the next round reports the gap
                pending_closed = True
                break
            return UploadPlan(
                UploadDecision.GAP,
                gap=Gap(expected, seg.base_offset),
                detail=f"manifest ends at {expected - 1} but the next local segment starts "
                f"at {seg.base_offset}",
            )
        candidates.append(_closed_candidate(seg, expected, state.compaction_holes))
        expected = seg.last_offset + 1

    active = log.active
    if (
        not pending_closed
        and not candidates
        and active is not None
        and expected is not None
        and active.size_bytes > 0
        and active.base_offset > expected
        and not state.compaction_holes
    ):
        # no closed segment continues the manifest and the active one starts later
        return UploadPlan(
            UploadDecision.GAP,
            gap=Gap(expected, active.base_offset),
            detail=f"manifest ends at {expected - 1} but the active segment starts at "
            f"{active.base_offset}",
        )
    if active is not None and not pending_closed:
        after = ArchivalState(None if expected is None else expected - 1, state.last_upload_ms,
                              state.compaction_holes)
        room = len(candidates) < params.max_candidates_per_round
        if room and idle_upload_due(log, after, params, now_ms):
            if not active_batches and not candidates:
                return UploadPlan(
                    UploadDecision.NEEDS_ACTIVE_BATCHES,
                    detail="idle timeout due; the active segment's batch boundaries are needed",
                )
            prefix = _stable_prefix(active, active_batches, expected, stable_end)
            if isinstance(prefix, UploadPlan):
                if not candidates:
                    return prefix
            elif prefix is not None:
                candidates.append(prefix)

    if candidates:
        return UploadPlan(
            UploadDecision.UPLOAD,
            tuple(candidates),
            detail=f"{len(candidates)} candidate(s) from offset {candidates[0].begin_inclusive}",
        )
    if pending_closed or _has_data_past(log, manifest_last):
        return UploadPlan(
            UploadDecision.WAIT, detail=f"no data past the manifest is below {stable_end} yet"
        )
    return UploadPlan(UploadDecision.UP_TO_DATE, detail="manifest covers all local data")


def _closed_candidate(seg: LocalSegment, expected: int | None, holes: bool = False
                      ) -> UploadCandidate:
    begin = seg.base_offset if expected is None else expected
    # a segment starting after the manifest's next offset across compaction's holes goes up
    # whole, its object's range widened down to `begin`
    whole = begin <= seg.base_offset
    # a manifest ending inside the segment means an idle-timeout upload took its head earlier,
    # or (compacted topic) the broker's cleaner merged segments across the manifest's end
    return UploadCandidate(
        UploadKind.SEGMENT if whole else UploadKind.SEGMENT_SUFFIX,
        seg.base_offset,
        begin,
        seg.end_exclusive,
        0 if whole else None,
        seg.size_bytes,
        seg.max_timestamp_ms,
        seg.paths,
        holes,
    )


def _stable_prefix(
    active: ActiveSegment,
    batches: Sequence[BatchSpan],
    expected: int | None,
    stable_end: int,
) -> UploadCandidate | UploadPlan | None:
    """The idle-timeout candidate: the longest run of whole batches that continues the
    manifest and ends below the stable end; a GAP / OVERLAP plan when the batches do not
    continue it; None when no batch qualifies."""
    _check_batches(active, batches)
    picked: list[BatchSpan] = []
    for batch in batches:
        if expected is not None and batch.last_offset < expected:
            continue  # already uploaded by an earlier idle upload
        if batch.last_offset >= stable_end:
            break
        if not picked and expected is not None and batch.base_offset != expected:
            if batch.base_offset < expected:
                return UploadPlan(
                    UploadDecision.OVERLAP,
                    detail=f"manifest ends at {expected - 1}, inside the batch "
                    f"{batch.base_offset}..{batch.last_offset} of the active segment",
                )
            return UploadPlan(
                UploadDecision.GAP,
                gap=Gap(expected, batch.base_offset),
                detail=f"manifest ends at {expected - 1} but the active segment resumes at "
                f"{batch.base_offset}",
            )
        picked.append(batch)
    if not picked:
        return None
    first, last = picked[0], picked[-1]
    return UploadCandidate(
        UploadKind.STABLE_PREFIX,
        active.base_offset,
        first.base_offset,
        last.last_offset + 1,
        first.position,
        last.position + last.size,
        max(b.max_timestamp for b in picked),
        active.paths,
    )


def _has_data_past(log: LogSnapshot, manifest_last: int | None) -> bool:
    uploaded_end = -1 if manifest_last is None else manifest_last
    if any(not s.is_empty and s.last_offset > uploaded_end for s in log.closed):
        return True
    return (
        log.active is not None
        and log.active.size_bytes > 0
        and (log.high_watermark > max(log.active.base_offset, uploaded_end + 1))
    )


def check_log_layout(
    segments: Sequence[LocalSegment], active_base_offset: int | None, where: str = "log"
) -> None:
    """Closed segments must be in offset order without overlap, and the active segment (when
    there is one) must start after the last of them; PolicyInputError otherwise. Base offsets
    strictly increase even past an empty segment: they are the files' names."""
    ends = [max(s.last_offset, s.base_offset) for s in segments]
    for prev_end, prev, cur in zip(ends, segments, segments[1:], strict=False):
        if cur.base_offset <= prev_end:
            raise PolicyInputError(
                f"{where}: segment {cur.base_offset} overlaps or precedes segment "
                f"{prev.base_offset}..{prev.last_offset}"
            )
    if segments and active_base_offset is not None and active_base_offset <= ends[-1]:
        raise PolicyInputError(
            f"{where}: active segment base {active_base_offset} does not follow segment "
            f"{segments[-1].base_offset}..{segments[-1].last_offset}"
        )


def _check_batches(active: ActiveSegment, batches: Sequence[BatchSpan]) -> None:
    """Batches must tile the file from where they start, in offset order, inside the active
    segment; anything else means the caller walked the wrong file or a damaged one."""
    prev: BatchSpan | None = None
    for batch in batches:
        if batch.size <= 0 or batch.position < 0 or batch.last_offset < batch.base_offset:
            raise PolicyInputError(
                f"active segment {active.base_offset}: malformed batch at byte "
                f"{batch.position} (size {batch.size}, offsets "
                f"{batch.base_offset}..{batch.last_offset})"
            )
        if batch.base_offset < active.base_offset:
            raise PolicyInputError(
                f"batch {batch.base_offset} precedes its active segment {active.base_offset}"
            )
        if prev is not None and (
            batch.position != prev.position + prev.size or batch.base_offset <= prev.last_offset
        ):
            raise PolicyInputError(
                f"active segment {active.base_offset}: batch at byte {batch.position} does "
                f"not follow the batch at byte {prev.position}"
            )
        prev = batch
