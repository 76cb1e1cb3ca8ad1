"""Planning adjacent-segment merges: pure functions over manifest data, no I/O.

Redpanda's rules ("Adjacent segment merging"):

* a segment smaller than `cloud_storage_segment_size_min` is a merge candidate (default: half
  the topic's segment size);
* adjacent candidates of the same term with contiguous offsets form a run whose total stays
  at or under `cloud_storage_segment_size_target` (default: the topic's segment size);
* a run cut short by a large segment, a term change, a gap or a compacted segment is merged
  even if the result stays below the minimum ("no other options");
* a run that reaches the end of the partition waits for more data, unless it already reaches
  the minimum (merging it now would produce another small segment to merge again later);
* a run needs at least two segments: re-uploading one alone gains nothing;
* a run spans fewer than 2**31 offsets, so its `.index` can hold 4-byte relative offsets
  (Kafka rolls a segment for the same reason).

Only the segments listed in the head manifest are planned. Archived manifests are immutable
(`ops.replace_segments` refuses their offsets) and what they describe was already spilled,
so the memory merging saves is the head's; runs therefore never cross into archived history.
Compacted topics are not merged (in Redpanda their segments are re-uploaded after compaction).
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from manifests.model import SegmentTable

#: largest `last_offset - base_offset` of one segment: `.index` entries store 4-byte offsets
#: relative to the segment's base
MAX_OFFSET_SPAN = 2**31 - 1

if TYPE_CHECKING:
    from manifests import TopicManifest
    from tiered.config import TopicConfig


@dataclass(frozen=True)
class MergeLimits:
    """Sizes (bytes) that bound a merge for one topic."""

    #: merged segments grow up to this
    target_bytes: int
    #: segments below this are candidates; a tail run at or above it need not wait
    min_bytes: int

    def __post_init__(self) -> None:
        if self.target_bytes < 1 or self.min_bytes < 0 or self.min_bytes > self.target_bytes:
            raise ValueError(
                f"merge limits: need 0 <= min ({self.min_bytes}) <= target "
                f"({self.target_bytes}) and target >= 1"
            )


def merge_limits(
    cluster: Mapping[str, object], tc: TopicConfig, tm: TopicManifest | None = None
) -> MergeLimits:
    """The limits for one topic. The segment size defaults come from the configuration's own
    `segment.bytes` for the topic when it sets one, else from the topic manifest in the bucket
    (what the writer used), else the cluster's `log_segment_size`."""
    segment_bytes = tc.segment_bytes
    if "segment.bytes" not in tc.overrides and tm is not None and tm.segment_bytes:
        segment_bytes = tm.segment_bytes
    target = cluster.get("cloud_storage_segment_size_target")
    minimum = cluster.get("cloud_storage_segment_size_min")
    target_bytes = int(target) if isinstance(target, int) else segment_bytes
    min_bytes = int(minimum) if isinstance(minimum, int) else segment_bytes // 2
    return MergeLimits(max(1, target_bytes), min(min_bytes, max(1, target_bytes)))


def is_compacted_topic(tc: TopicConfig, tm: TopicManifest | None = None) -> bool:
    """Whether compaction applies to the topic by the configuration or the bucket's record."""
    policies = [tc.cleanup_policy] + ([tm.cleanup_policy] if tm is not None else [])
    return any("compact" in p.split(",") for p in policies)


@dataclass(slots=True)
class AdjacentSegmentRun:
    """A run of adjacent segments being collected (after Redpanda's `adjacent_segment_run`):
    feed segments in offset order to `maybe_add`, which says whether each one joined."""

    #: the run may grow up to this many bytes
    target_bytes: int
    #: row index of the run's first segment in its table
    first_index: int = 0
    segment_count: int = 0
    base_offset: int = -1
    last_offset: int = -1
    size_bytes: int = 0
    segment_term: int = -1

    def maybe_add(self, index: int, base: int, last: int, size: int, term: int) -> bool:
        """Add the segment at row `index` (offsets `base..last` inclusive, `size` bytes) if it
        continues the run: same term, the next offset, the total still within the target and
        the offset span within `MAX_OFFSET_SPAN`. An empty run takes any segment that fits."""
        if self.segment_count == 0:
            if size > self.target_bytes:
                return False
            self.first_index, self.base_offset, self.segment_term = index, base, term
        elif (
            term != self.segment_term
            or base != self.last_offset + 1
            or index != self.first_index + self.segment_count
            or self.size_bytes + size > self.target_bytes
            or last - self.base_offset > MAX_OFFSET_SPAN
        ):
            return False
        self.segment_count += 1
        self.last_offset = last
        self.size_bytes += size
        return True


@dataclass(frozen=True, slots=True)
class MergeRun:
    """A planned merge: rows `[first_index, end_index)` of the head's segment table, which hold
    offsets `base_offset..last_offset` (both inclusive), become one object."""

    first_index: int
    end_index: int
    base_offset: int
    last_offset: int
    size_bytes: int
    segment_term: int

    @property
    def segment_count(self) -> int:
        return self.end_index - self.first_index


class Outcome(enum.Enum):
    """Why a partition's plan is what it is; expected outcomes, not errors."""

    RUNS = "runs of small segments to merge"
    NOTHING_SMALL = "no runs of small adjacent segments"
    TAIL_WAITING = "the only run of small segments is at the end and waits for more data"
    EMPTY = "no segments in the head manifest"
    COMPACTED = "compacted topic: segments are re-uploaded after compaction, not merged"


@dataclass(frozen=True)
class MergePlan:
    runs: tuple[MergeRun, ...]
    outcome: Outcome
    #: segments and bytes in a tail run left to wait for more data
    waiting_segments: int = 0
    waiting_bytes: int = 0


def _finish(run: AdjacentSegmentRun | None) -> MergeRun | None:
    if run is None or run.segment_count < 2:
        return None
    return MergeRun(
        run.first_index,
        run.first_index + run.segment_count,
        run.base_offset,
        run.last_offset,
        run.size_bytes,
        run.segment_term,
    )


def plan_runs(segments: SegmentTable, limits: MergeLimits) -> MergePlan:
    """Runs to merge among `segments` (a head manifest's table, offset order), by the rules in
    the module docstring. O(n) over the table's columns; no row objects are built."""
    n = len(segments)
    if n == 0:
        return MergePlan((), Outcome.EMPTY)
    base: array[int] = segments.base_offsets
    last: array[int] = segments.last_offsets
    size = segments.column("size_bytes")
    term = segments.column("segment_term")
    compacted = segments.column("compacted")
    min_bytes, target = limits.min_bytes, limits.target_bytes
    runs: list[MergeRun] = []
    run: AdjacentSegmentRun | None = None
    for i in range(n):
        if size[i] >= min_bytes or compacted[i]:
            done = _finish(run)
            if done is not None:
                runs.append(done)
            run = None
            continue
        if run is not None and run.maybe_add(i, base[i], last[i], size[i], term[i]):
            continue
        done = _finish(run)
        if done is not None:
            runs.append(done)
        run = AdjacentSegmentRun(target)
        run.maybe_add(i, base[i], last[i], size[i], term[i])
    waiting_segments = waiting_bytes = 0
    if run is not None:  # the run reaches the end of the partition
        done = _finish(run) if run.size_bytes >= min_bytes else None
        if done is not None:
            runs.append(done)
        else:
            waiting_segments, waiting_bytes = run.segment_count, run.size_bytes
    if runs:
        outcome = Outcome.RUNS
    elif waiting_segments >= 2:
        outcome = Outcome.TAIL_WAITING
    else:
        outcome = Outcome.NOTHING_SMALL
    return MergePlan(tuple(runs), outcome, waiting_segments, waiting_bytes)
