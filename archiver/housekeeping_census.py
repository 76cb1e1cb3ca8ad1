"""One listing of the bucket in place of a full housekeeping pass per idle partition.

A partition whose last full housekeeping found nothing waiting is quiet for one GC grace
period (`RemoteHousekeeper.quiet`). After that, its next full pass lists its prefixes and
reads its head and archived manifests: a few requests every grace period for a partition where
nothing happened, tens of thousands an hour at 10,000 idle partitions. The census stands in for
those passes with one listing of the whole bucket, a request per thousand objects: a cost that
follows the data, not the partition count (docs/operations.md, "An idle partition").

A partition is spared its full pass when the listing shows its head at the version its last
full pass left and every other object of its prefixes exactly as that pass judged them: the
same keys with the same ETags (`manifests.collect.listing_fingerprint`, built as the listing
goes, so the census holds 16 bytes per partition, not its objects; the head's copies and the
lease, rewritten as the node works and never collected, are left out). Nothing any writer
could have done since is then in the bucket, so that pass's verdict, nothing waiting, still
holds, and the partition counts as housekept as of the census. An object added (another
writer's upload that never committed), removed or rewritten, a head changed, lost or garbled:
each makes the partition's fingerprint or head differ, and its full pass runs as before. The
census deletes nothing and commits nothing; a partition it wrongly takes for changed costs one
full pass.

The listing is cut by the first hex digit of the partitions' hash prefixes, the pieces listed
side by side (`shards`), as the full passes run side by side: its time follows the bucket's
size over the parallelism, not the partition count. Objects of the candidates cost the same
requests either way (a full pass lists its partition too); the other objects are the census's
own cost. A bucket shared by many sidecars may hold far more of those than this node's
partitions: a piece gives up, and its partitions have their full passes, once it has listed
more of them than the passes it would spare cost in requests (`OBJECTS_PER_SPARED_PASS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from manifests import keys
from manifests.collect import Fingerprint, unjudged_keys
from manifests.lease_objects import PartitionId
from tiered.store.base import ObjectInfo

__all__ = ["OBJECTS_PER_SPARED_PASS", "Census", "Judged", "shards"]

#: objects of other partitions a census may list for each full pass it would spare: a full
#: pass is about three requests (its listing, the head, an archived manifest), a listing page
#: a thousand objects
OBJECTS_PER_SPARED_PASS = 3 * 1000

#: what a full housekeeping pass judged of a partition and left in place: the head's ETag
#: and the `listing_fingerprint` of the other objects (`PartitionState.housekept_listing`)
Judged = tuple[str, bytes]


@dataclass
class _Listed:
    """What the census listing showed of one candidate partition."""

    data_prefix: str
    meta_prefix: str
    head_key: str
    left_out: frozenset[str]
    head_etag: str | None = None
    #: of the other objects, as they are listed (in key order, as the full pass sorts them)
    fingerprint: Fingerprint = field(default_factory=Fingerprint)


def shards(judged: Mapping[PartitionId, Judged]) -> dict[str, Census]:
    """One census per first hex digit of the candidates' hash prefixes, each for the
    candidates under it, to be fed the listing of that digit (`ObjectStore.list(digit)`)."""
    by_digit: dict[str, dict[PartitionId, Judged]] = {}
    for pid, judgement in judged.items():
        by_digit.setdefault(keys.partition_prefix(*pid)[0], {})[pid] = judgement
    return {digit: Census(part, max_foreign=OBJECTS_PER_SPARED_PASS * len(part))
            for digit, part in sorted(by_digit.items())}


class Census:
    """Matches one listing, object by object, against what the last full pass of each
    candidate partition judged. Pure: it is fed what a listing yields."""

    def __init__(self, judged: Mapping[PartitionId, Judged], *, max_foreign: int) -> None:
        self.judged = dict(judged)
        self._listed: dict[PartitionId, _Listed] = {}
        #: candidates by the hash prefix `{h}/` their objects share (two may share one)
        self._by_prefix: dict[str, list[tuple[PartitionId, _Listed]]] = {}
        for pid in self.judged:
            listed = _Listed(keys.partition_data_prefix(*pid), keys.partition_meta_prefix(*pid),
                             keys.partition_manifest_key(*pid), unjudged_keys(*pid))
            self._listed[pid] = listed
            self._by_prefix.setdefault(keys.partition_prefix(*pid), []).append((pid, listed))
        self.max_foreign = max_foreign
        #: objects fed so far, and those of them no candidate's
        self.objects = 0
        self.foreign = 0
        #: listed more than `max_foreign` objects of other partitions: the census gave up
        self.gave_up = False

    def feed(self, info: ObjectInfo) -> bool:
        """Take the next listed object; False once the census has listed more objects of
        other partitions than it may (it gives up: every candidate has its full pass)."""
        self.objects += 1
        key = info.key
        ours = False
        for _pid, listed in self._by_prefix.get(key[:key.find("/") + 1], ()):
            if key == listed.head_key:
                listed.head_etag = info.etag
                ours = True
            elif key.startswith((listed.data_prefix, listed.meta_prefix)):
                ours = True
                if key not in listed.left_out:
                    listed.fingerprint.add(key, info.etag)
        if not ours:
            self.foreign += 1
            if self.foreign > self.max_foreign:
                self.gave_up = True
                return False
        return True

    def unchanged(self) -> list[PartitionId]:
        """The candidates the listing shows as their last full pass left them: the head at
        the version it judged, every other object the same key and ETag. None once the
        census gave up."""
        if self.gave_up:
            return []
        return [pid for pid, listed in self._listed.items()
                if listed.head_etag == self.judged[pid][0]
                and listed.fingerprint.digest() == self.judged[pid][1]]
