"""The bucket never forgets: copies of the head manifest, and what a writer does without one.

docs/format.md, "Losing objects": every commit writes the head's exact bytes beside it, in
one of two copy slots by the parity of its sequence. A writer about to create a head where
none is stored first lists the partition's prefixes and restores the newest copy whose every
named object is still there, or refuses (`HistoryWithoutHead`) when objects of ours lie
below the start the new head would have: a missing head is never "nothing was there". A
garbled head is replaced, on its own ETag, by such a copy, its bytes kept beside it.

`HeadCopies` is the part of `ManifestStore` that does this; it reads and remembers heads
through the store's own methods, so fencing and the version cache stay one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from manifests import keys
from manifests.cas import put_on_version
from manifests.errors import CorruptManifest, HistoryWithoutHead, ManifestConflict
from manifests.manifest import PartitionManifest
from manifests.serde import decode_partition_manifest, encode_partition_manifest
from tiered.store.base import ObjectInfo, ObjectStore
from tiered.store.errors import ObjectNotFound, PreconditionFailed, StoreError

log = logging.getLogger(__name__)

#: one consistent (head, ETag) read, None when the head is missing
ReadHead = Callable[[str], tuple[PartitionManifest, str] | None]


def list_partition(store: ObjectStore, topic: str, partition: int, revision: str | int
                   ) -> tuple[list[ObjectInfo], list[ObjectInfo]]:
    """Every object under the partition's data prefix, then under its meta prefix, from one
    listing of the prefix above both (one LIST for a new partition, not two)."""
    data = keys.partition_data_prefix(topic, partition, revision)
    meta = keys.partition_meta_prefix(topic, partition, revision)
    listed = list(store.list(keys.partition_prefix(topic, partition, revision)))
    return ([i for i in listed if i.key.startswith(data)],
            [i for i in listed if i.key.startswith(meta)])


class RestoreCounter(Protocol):
    """Where restores are counted (`ManifestStoreStats`)."""

    restored: int


class HeadCopies:
    """Writes the head's copies and restores a missing or garbled head from them."""

    def __init__(
        self,
        store: ObjectStore,
        stats: RestoreCounter,
        *,
        read_head: ReadHead,
        remember: Callable[[str, str, PartitionManifest], None],
        archive_keys: Callable[[PartitionManifest], set[str]],
    ) -> None:
        self.store = store
        self.stats = stats
        self._read_head = read_head
        self._remember = remember
        self._archive_keys = archive_keys

    def keep(self, m: PartitionManifest, data: bytes, *, every_slot: bool = False) -> None:
        """Write the committed version beside the head, in its sequence's slot: a deleted or
        garbled head is restored exactly from it (cutoff and recorded start included). A copy
        that fails to go up costs nothing now; the other slot still holds a whole copy.
        `every_slot`: in both slots (the head's format just rose: no copy in the older
        format may stay)."""
        slots = (keys.head_copy_keys(m.key) if every_slot
                 else (keys.head_copy_key(m.key, m.sequence),))
        for slot in slots:
            try:
                self.store.put(slot, data)
            except StoreError as exc:
                log.warning("%s: could not write the head's copy: %s", m.key, exc)

    def newest_copy(self, key: str) -> PartitionManifest | None:
        """The newest readable copy of the head at `key`, read-only: what a reader serves
        while the head is missing or unreadable and no writer has restored it yet. None when
        no slot holds one. Its objects are not checked here (a restore lists them first); a
        read of one that is gone fails as any read of a missing object does."""
        found: list[PartitionManifest] = []
        for copy_key in keys.head_copy_keys(key):
            try:
                m = decode_partition_manifest(self.store.get(copy_key), key=key)
            except ObjectNotFound:
                continue
            except CorruptManifest as exc:
                log.warning("%s: the copy %s is unreadable: %s", key, copy_key, exc)
                continue
            if m.key == key:
                found.append(m)
        return max(found, key=lambda c: c.sequence, default=None)

    def lost_history(self, empty: PartitionManifest) -> str | None:
        """For a partition whose head `load` found missing, read-only (describe-storage): what
        says the head was lost (copies, or objects of ours below offset 0's head), None when
        the bucket holds nothing of the partition's."""
        data, meta = list_partition(self.store, empty.topic, empty.partition, empty.revision)
        listing = [i.key for i in (*data, *meta)]
        ours = [k for k in listing if keys.segment_name_of(k.rsplit("/", 1)[-1]) is not None
                or ".copy-" in k or keys.parse_archived_manifest_name(k.rsplit("/", 1)[-1])]
        if not ours:
            return None
        return (f"{empty.key}: no head manifest, but {len(ours)} object(s) of the partition are "
                "in the bucket (the next writer restores the head from its copy, or stops the "
                f"partition); if it stays, run `tiered recover --rebuild-manifests --topic "
                f"{empty.topic}`")

    def restore_head(self, empty: PartitionManifest) -> tuple[PartitionManifest, str] | None:
        """For a partition whose head `load` found missing (`empty` is what it returned): the
        head restored from its newest complete copy, or None when the bucket holds nothing of
        the partition's; `HistoryWithoutHead` when it holds history no copy restores."""
        try:
            self.guard_fresh_head(empty)
        except ManifestConflict as restored:
            if restored.current is None or restored.etag is None:
                return None
            return restored.current, restored.etag
        return None

    def restore_garbled(self, topic: str, partition: int, revision: str | int
                        ) -> tuple[PartitionManifest, str] | None:
        """For a head `load` found unreadable (`CorruptManifest`): replace it, by
        compare-and-swap on its own ETag, with the newest copy the bucket proves complete,
        keeping the bad bytes beside it (`.corrupt-<etag>`). None when no copy restores it
        (the partition stays stopped until `recover --rebuild-manifests`) or the head is gone
        meanwhile (the next pass finds it missing)."""
        key = keys.partition_manifest_key(topic, partition, revision)
        try:
            etag = self.store.head(key).etag
        except ObjectNotFound:
            return None
        data, meta_listed = list_partition(self.store, topic, partition, revision)
        meta = {i.key for i in meta_listed}
        return self._restore_from_copy(key, {i.key for i in data} | meta, meta, over=etag)

    def guard_fresh_head(self, manifest: PartitionManifest) -> set[str]:
        """Before creating a head where none is stored: restore the newest copy that the
        bucket proves complete (then `ManifestConflict` carries it, so `update` re-applies its
        change on top), or refuse with `HistoryWithoutHead` when objects of ours lie below the
        new head's start. A partition whose prefixes hold nothing of ours starts afresh.
        Returns the keys listed under both prefixes."""
        data_prefix = keys.partition_data_prefix(manifest.topic, manifest.partition,
                                                 manifest.revision)
        meta_prefix = keys.partition_meta_prefix(manifest.topic, manifest.partition,
                                                 manifest.revision)
        data, meta_listed = list_partition(self.store, manifest.topic, manifest.partition,
                                           manifest.revision)
        listing = {i.key for i in data}
        meta = {i.key for i in meta_listed}
        if manifest.key in meta:
            # a head is there after all: the create below loses its race as it should
            return listing | meta
        restored = self._restore_from_copy(manifest.key, listing | meta, meta)
        if restored is not None:
            raise ManifestConflict(manifest.key, *restored)
        below = [k for k in sorted(listing | meta) if _starts_below(
            k[len(data_prefix if k.startswith(data_prefix) else meta_prefix):],
            manifest.log_start_offset)]
        copies = [k for k in meta if k.startswith(manifest.key + ".copy-")]
        if below or copies:
            detail = (f"{len(below)} object(s) below offset {manifest.log_start_offset}, e.g. "
                      f"{below[0]}" if below else f"copies that do not restore: {copies[0]}")
            raise HistoryWithoutHead(manifest.key, detail, manifest.topic)
        return listing | meta

    def _restore_from_copy(self, key: str, present: set[str], meta: set[str], *,
                           over: str | None = None) -> tuple[PartitionManifest, str] | None:
        """Create the head from the newest valid copy whose every named object is `present`
        (If-None-Match: a head another writer created meanwhile wins), or with `over`, replace
        the unreadable head of that ETag (If-Match: a writer's repair meanwhile wins). None
        when no copy proves complete."""
        found: list[PartitionManifest] = []
        for slot in keys.HEAD_COPY_SLOTS:
            copy_key = f"{key}.{slot}"
            if copy_key not in meta:
                continue
            try:
                m = decode_partition_manifest(self.store.get(copy_key), key=key)
            except (ObjectNotFound, CorruptManifest) as exc:
                log.warning("%s: the copy %s does not restore the head: %s", key, copy_key, exc)
                continue
            if m.key == key:
                found.append(m)
        for m in sorted(found, key=lambda c: c.sequence, reverse=True):
            missing = [k for k in self._named_keys(m) if k not in present]
            if missing:
                log.warning("%s: the copy at sequence %d names %d object(s) the bucket no "
                            "longer holds, e.g. %s", key, m.sequence, len(missing), missing[0])
                continue
            data = encode_partition_manifest(m)
            try:
                if over is not None:
                    self.store.put(f"{key}.corrupt-{over.strip(chr(34))[:16]}",
                                   self.store.get(key))
                etag = put_on_version(self.store, key, data, over)
            except (PreconditionFailed, ObjectNotFound):
                return self._read_head(key)  # another writer got there first: take its head
            self._remember(key, etag, m)
            log.warning("%s: the head manifest was %s; restored it from its copy at "
                        "sequence %d (offsets %d..%d)", key,
                        "missing" if over is None else "unreadable (kept beside it as .corrupt-)",
                        m.sequence, m.log_start_offset, m.last_offset)
            self.stats.restored += 1
            return m, etag
        return None

    def _named_keys(self, m: PartitionManifest) -> list[str]:
        """Every object key a head names: its segments and replaced segments, and the archived
        manifests it lists (not what they list in turn: those are checked when read)."""
        out = [m.segment_key(s) for s in m.segments]
        out += [m.segment_key(r.segment) for r in m.replaced]
        out += sorted(self._archive_keys(m))
        return out


def _starts_below(name: str, offset: int) -> bool:
    """Whether `name` (under a partition's data or meta prefix) is a segment, index or
    archived manifest of ours whose offsets begin below `offset`."""
    segment = keys.segment_name_of(name)
    parsed = None if segment is None else keys.parse_segment_name(segment)
    if parsed is not None:
        return parsed.base_offset < offset
    archived = keys.parse_archived_manifest_name(name)
    return archived is not None and archived.base_offset < offset
