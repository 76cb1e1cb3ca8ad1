"""The index objects that travel beside a segment object (docs/format.md, "Segment and index
objects").

A segment's offset, time and transaction indexes are stored in one of two layouts, recorded
per segment in the manifest (`SegmentMeta.index_layout`):

- `INDEX_FILES`: Kafka's own files, one object each (`{stem}.index`, `{stem}.timeindex`, and
  `{stem}.txnindex` when the segment has aborted transactions). Earlier releases wrote every
  segment so; they stay readable.
- `INDEX_BUNDLE`: one object `{stem}.indexes` holding all of them. A segment then costs two
  PUTs instead of three or four, and a reader gets its offset and time index with one GET.

A bundle is small binary framing around the Kafka index bytes, each section with its own
CRC-32C, so a garbled bundle is refused rather than read as an index:

    magic "TIDX" | version u8 (1) | count u8 | count x (kind u8, length u32, crc32c u32)
    | the sections' bytes, in the order of their entries

Integers are big-endian, as in Kafka's formats. Kinds: 1 offset index, 2 time index,
3 transaction index; each at most once.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Protocol

import crc32c

from manifests import keys
from manifests.model import INDEX_BUNDLE, INDEX_FILES, SegmentMeta
from tiered.errors import CorruptSegmentError
from tiered.store.errors import ObjectNotFound

#: the index kinds a segment may carry, by `manifests.keys` kind name
INDEX_KINDS = ("index", "timeindex", "txnindex")
#: the `manifests.keys` kind of a bundle object
BUNDLE_KIND = "indexes"
#: the layout new segment objects are written with
DEFAULT_LAYOUT = INDEX_BUNDLE

_MAGIC = b"TIDX"
_VERSION = 1
_HEAD = struct.Struct(">4sBB")
_ENTRY = struct.Struct(">BII")
_KIND_IDS = {"index": 1, "timeindex": 2, "txnindex": 3}
_KIND_NAMES = {v: k for k, v in _KIND_IDS.items()}
#: room beyond the segment's own size for the index objects of a segment: three index files
#: preallocated at Kafka's default `segment.index.bytes` (10 MiB) and never trimmed
INDEX_ALLOWANCE = 32 * 1024 * 1024


class Getter(Protocol):
    """What reading needs of a store: `ObjectStore.get`."""

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes: ...


class Putter(Protocol):
    """What writing needs of a store: `ObjectStore.put`."""

    def put(self, key: str, data: bytes) -> object: ...


def bundle_size(section_sizes: Iterable[int]) -> int:
    """The bytes of a bundle holding sections of these sizes."""
    sizes = list(section_sizes)
    return _HEAD.size + _ENTRY.size * len(sizes) + sum(sizes)


def encode_bundle(sections: Mapping[str, bytes]) -> bytes:
    """One bundle holding `sections` (kind -> the Kafka index file's bytes), in kind order."""
    unknown = set(sections) - set(_KIND_IDS)
    if unknown:
        raise ValueError(f"unknown index kinds {sorted(unknown)}")
    kinds = [k for k in INDEX_KINDS if k in sections]
    head = [_HEAD.pack(_MAGIC, _VERSION, len(kinds))]
    head += [_ENTRY.pack(_KIND_IDS[k], len(sections[k]), crc32c.crc32c(sections[k]))
             for k in kinds]
    return b"".join([*head, *(bytes(sections[k]) for k in kinds)])


def decode_bundle(data: bytes, *, path: str | None = None) -> dict[str, bytes]:
    """The sections of a bundle, by kind. Every length is checked against the bytes present
    before it is used, and every section against its CRC-32C: `CorruptSegmentError` (naming
    `path`) for anything else."""
    def bad(reason: str) -> CorruptSegmentError:
        return CorruptSegmentError(f"not an index bundle: {reason}", path=path)

    view = memoryview(data)
    if len(view) < _HEAD.size:
        raise bad(f"{len(view)} bytes")
    magic, version, count = _HEAD.unpack_from(view)
    if magic != _MAGIC:
        raise bad(f"magic {bytes(magic)!r}")
    if version != _VERSION:
        raise bad(f"version {version} (this release reads {_VERSION})")
    if count > len(_KIND_IDS):
        raise bad(f"{count} sections")
    pos = _HEAD.size + count * _ENTRY.size
    if pos > len(view):
        raise bad(f"{count} entries do not fit in {len(view)} bytes")
    out: dict[str, bytes] = {}
    for i in range(count):
        kind_id, length, crc = _ENTRY.unpack_from(view, _HEAD.size + i * _ENTRY.size)
        kind = _KIND_NAMES.get(kind_id)
        if kind is None or kind in out:
            raise bad(f"section kind {kind_id} unknown or repeated")
        if length > len(view) - pos:
            raise bad(f"section {kind} of {length} bytes runs past the end")
        section = bytes(view[pos:pos + length])
        if crc32c.crc32c(section) != crc:
            raise bad(f"section {kind} fails its CRC-32C")
        out[kind] = section
        pos += length
    if pos != len(view):
        raise bad(f"{len(view) - pos} bytes after the last section")
    return out


def index_object_names(seg: SegmentMeta) -> tuple[str, ...]:
    """The names of every object the segment's indexes may occupy, by its layout."""
    if seg.index_layout == INDEX_BUNDLE:
        return (keys.index_name(seg.object_name, BUNDLE_KIND),)
    return tuple(keys.index_name(seg.object_name, kind) for kind in INDEX_KINDS)


def index_bytes_bound(segment_bytes: int) -> int:
    """The most bytes the index objects of a segment of `segment_bytes` may hold. Each index
    entry stands for a batch of at least 61 bytes and takes 8 (offset), 12 (time) or 34
    (aborted transaction, one per control batch) bytes, so well-formed indexes stay below the
    segment's own size; `INDEX_ALLOWANCE` covers index files a broker left untrimmed. A
    larger object is garbage (a damaged bucket), refused without being read whole."""
    return max(0, segment_bytes) + INDEX_ALLOWANCE


def _get_bounded(store: Getter, key: str, bound: int) -> bytes:
    """The object at `key`, read only up to `bound` + 1 bytes: `CorruptSegmentError` when it
    holds more than `bound` (one request either way: a ranged GET)."""
    data = store.get(key, (0, bound + 1))
    if len(data) > bound:
        raise CorruptSegmentError(f"index object larger than {bound} bytes, the most the "
                                  "indexes of its segment may hold", path=key)
    return data


def read_indexes(store: Getter, prefix: str, segment_name: str, layout: int,
                 kinds: Iterable[str], *, segment_bytes: int) -> dict[str, bytes | None]:
    """The indexes of `kinds` (None: the segment has none of that kind) of the segment object
    `segment_name` of `segment_bytes`, whose indexes are in `layout`, read from under the
    partition's data prefix `prefix`. No index object is read beyond
    `index_bytes_bound(segment_bytes)`: a larger one is refused as corrupt.

    Kafka's files: one GET per kind, and a missing object is None (earlier releases wrote no
    `.txnindex` for a segment without aborted transactions; readers rebuild a missing offset
    or time index). A bundle: one GET for every kind. A missing bundle raises
    `ObjectNotFound`: it always goes up before its segment, so its absence is damage, never
    "no aborted transactions". `CorruptSegmentError` for a bundle that does not decode."""
    wanted = list(kinds)
    bound = index_bytes_bound(segment_bytes)
    if layout == INDEX_BUNDLE:
        key = prefix + keys.index_name(segment_name, BUNDLE_KIND)
        sections = decode_bundle(_get_bounded(store, key, bound), path=key)
        return {kind: sections.get(kind) for kind in wanted}
    if layout != INDEX_FILES:
        raise CorruptSegmentError(f"unknown index layout {layout}", path=prefix + segment_name)
    out: dict[str, bytes | None] = {}
    for kind in wanted:
        try:
            out[kind] = _get_bounded(store, prefix + keys.index_name(segment_name, kind), bound)
        except ObjectNotFound:
            out[kind] = None
    return out


def write_indexes(store: Putter, prefix: str, segment_name: str,
                  sections: Mapping[str, bytes], layout: int = DEFAULT_LAYOUT
                  ) -> list[tuple[str, int]]:
    """Put the indexes of the segment object `segment_name` in `layout` (before the segment
    object itself: a segment in the bucket always has its indexes beside it); returns each
    object written as (key, bytes)."""
    if layout == INDEX_BUNDLE:
        key = prefix + keys.index_name(segment_name, BUNDLE_KIND)
        blob = encode_bundle(sections)
        store.put(key, blob)
        return [(key, len(blob))]
    written = []
    for kind, blob in sections.items():
        key = prefix + keys.index_name(segment_name, kind)
        store.put(key, blob)
        written.append((key, len(blob)))
    return written
