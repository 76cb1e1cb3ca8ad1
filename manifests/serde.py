"""JSON serialization of head and archived manifests (format: docs/format.md).

Bytes in, bytes out. Tables are written column-wise with delta coding (offsets are implied by
contiguity, timestamps and terms stored as differences), which keeps a segment near 45 bytes of
JSON: that density is what lets one head list a million segments' worth of archives.

Readers are strict: a version newer than `FORMAT_VERSION` is refused with
`UnsupportedManifestVersion`; anything malformed (bad UTF-8, bad JSON, NaN, duplicate or
unknown fields, wrong types, out-of-range numbers, broken invariants) is refused with
`CorruptManifest` naming the object key and the field. No `KeyError`/`TypeError` escapes.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterator, Mapping
from itertools import accumulate, chain
from operator import add, sub
from typing import Any

from manifests import keys
from manifests.errors import CorruptManifest, InvalidName, UnsupportedManifestVersion
from manifests.manifest import (
    ArchivedManifest,
    PartitionManifest,
    archived_problem,
    manifest_problem,
)
from manifests.model import (
    ARCHIVE_FORMAT_VERSION,
    FORMAT_VERSION,
    HEAD_FORMAT_VERSION,
    INDEX_LAYOUTS,
    ArchiveTable,
    ReplacedSegment,
    SegmentTable,
)

KIND_PARTITION = "partition"
KIND_ARCHIVE = "archive"
_SEPARATORS = (",", ":")
_INT64 = 2**63 - 1

_HEAD_FIELDS = (
    "version",
    "kind",
    "topic",
    "partition",
    "revision",
    "term",
    "sequence",
    "start_offset",
    "last_offset",
    "archive_start_offset",
    "archive_clean_offset",
    "cloud_bytes",
    "segments",
    "replaced",
    "archives",
)
_ARCHIVE_FIELDS = ("version", "kind", "topic", "partition", "revision", "term", "level")
#: the stored columns of a table beyond its offsets and timestamps, as (stored name, the
#: model's column in `FIELDS`, stored as differences from the previous row?); the model
#: declares its columns once (`SegmentTable.FIELDS`, `ArchiveTable.FIELDS`) and this says how
#: each is written, in the model's order (checked below)
_Column = tuple[str, str, bool]
_SEGMENT_EXTRA: tuple[_Column, ...] = (
    ("size_bytes", "size_bytes", False),
    ("segment_term_delta", "segment_term", True),
    ("writer_term_delta", "writer_term", True),
    ("crc32c", "checksum", False),
    ("compacted", "compacted", False),
)
#: the segment-table column of head version 4 and archived version 2: a manifest is written in
#: those versions only when one of its segments is not in Kafka's index files (layout 0), so
#: one whose segments all are is byte for byte what older releases wrote
_LAYOUT: _Column = ("index_layout", "index_layout", False)
_ARCHIVE_EXTRA: tuple[_Column, ...] = (
    ("size_bytes", "size_bytes", False),
    ("segment_count", "segment_count", False),
    ("crc32c", "checksum", False),
    ("level", "level", False),
)
for _table, _extra in ((SegmentTable, (*_SEGMENT_EXTRA, _LAYOUT)),
                       (ArchiveTable, _ARCHIVE_EXTRA)):
    if tuple(model for _, model, _ in _extra) != _table.FIELDS[4:]:
        raise AssertionError(f"{_table.__name__}.FIELDS and its stored columns disagree")
#: the offsets and timestamps, stored relative to the row's base and the previous row
_SPAN_COLUMNS = ("last_offset_from_base", "base_timestamp_delta", "max_timestamp_from_base")
_SEGMENT_COLUMNS = (*_SPAN_COLUMNS, *(stored for stored, _, _ in _SEGMENT_EXTRA))
_ARCHIVE_COLUMNS = (*_SPAN_COLUMNS, *(stored for stored, _, _ in _ARCHIVE_EXTRA))


class _Bad(Exception):
    """Internal: a field-level problem, turned into CorruptManifest with the key attached."""


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=_SEPARATORS).encode("ascii")


def _delta(col: array[int]) -> list[int]:
    """Each value minus the previous one; the first minus 0."""
    return list(map(sub, col, chain((0,), col)))


# -- encoding ----------------------------------------------------------------------------------


def _columns(t: SegmentTable | ArchiveTable, extra: tuple[_Column, ...]) -> dict[str, list[int]]:
    base, last = t.base_offsets, t.last_offsets
    ts0, ts1 = t.column("base_timestamp"), t.column("max_timestamp")
    out = {
        "last_offset_from_base": list(map(sub, last, base)),
        "base_timestamp_delta": _delta(ts0),
        "max_timestamp_from_base": list(map(sub, ts1, ts0)),
    }
    for stored, model, delta in extra:
        column = t.column(model)
        out[stored] = _delta(column) if delta else column.tolist()
    return out


def _has_layouts(t: SegmentTable) -> bool:
    """Whether some segment of `t` needs the `index_layout` column."""
    return any(t.column("index_layout"))


def _segment_columns(layouts: bool) -> tuple[_Column, ...]:
    return (*_SEGMENT_EXTRA, _LAYOUT) if layouts else _SEGMENT_EXTRA


def _encode_segments(t: SegmentTable, *, contiguous: bool = True,
                     layouts: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"count": len(t)}
    if contiguous:
        out["base_offset"] = t.first_base() if t else 0
    else:
        out["base_offsets"] = t.base_offsets.tolist()
    out.update(_columns(t, _segment_columns(layouts)))
    out["names"] = {str(i): name for i, name in enumerate(t.extra) if name}
    return out


def _encode_archives(t: ArchiveTable) -> dict[str, Any]:
    out: dict[str, Any] = {"count": len(t), "base_offset": t.first_base() if t else 0}
    out.update(_columns(t, _ARCHIVE_EXTRA))
    return out


def _head_version(m: PartitionManifest, replaced_rows: SegmentTable) -> int:
    """The oldest version that holds what this head carries (each requires the fields of the
    versions before it)."""
    if _has_layouts(m.segments) or _has_layouts(replaced_rows):
        return 4
    if m.collectable_below:
        return 3
    return 2 if m.gc_cutoff_ms else 1


def head_format_version(m: PartitionManifest) -> int:
    """The format version `encode_partition_manifest` writes `m` in."""
    return _head_version(m, SegmentTable.from_rows(r.segment for r in m.replaced))


def encode_partition_manifest(m: PartitionManifest) -> bytes:
    """The head manifest's JSON bytes (compact, ASCII)."""
    replaced_rows = SegmentTable.from_rows(r.segment for r in m.replaced)
    version = _head_version(m, replaced_rows)
    layouts = version >= 4
    replaced = _encode_segments(replaced_rows, contiguous=False, layouts=layouts)
    replaced["replaced_at"] = [r.replaced_at for r in m.replaced]
    cutoff: dict[str, int] = {}
    if version >= 2:
        cutoff["gc_cutoff_ms"] = m.gc_cutoff_ms
    if version >= 3:
        cutoff["collectable_below"] = m.collectable_below
    return _dumps(
        {
            "version": version,
            "kind": KIND_PARTITION,
            "topic": m.topic,
            "partition": m.partition,
            "revision": m.revision,
            "term": m.term,
            "sequence": m.sequence,
            "start_offset": m.start_offset,
            "last_offset": m.last_offset,
            "archive_start_offset": m.archive_start_offset,
            "archive_clean_offset": m.archive_clean_offset,
            "cloud_bytes": m.cloud_bytes,
            "segments": _encode_segments(m.segments, layouts=layouts),
            "replaced": replaced,
            "archives": _encode_archives(m.archives),
            **cutoff,
        }
    )


def encode_archived_manifest(a: ArchivedManifest) -> bytes:
    """An archived manifest's JSON bytes."""
    layouts = a.level == 0 and _has_layouts(a.segments)
    doc: dict[str, Any] = {
        "version": ARCHIVE_FORMAT_VERSION if layouts else FORMAT_VERSION,
        "kind": KIND_ARCHIVE,
        "topic": a.topic,
        "partition": a.partition,
        "revision": a.revision,
        "term": a.term,
        "level": a.level,
    }
    if a.level == 0:
        doc["segments"] = _encode_segments(a.segments, layouts=layouts)
    else:
        doc["archives"] = _encode_archives(a.children)
    return _dumps(doc)


def _row_costs(columns: dict[str, list[int]], n: int) -> list[int]:
    costs = [0] * n
    for values in columns.values():
        costs = list(map(add, costs, map(len, map(str, values))))
    return [c + len(columns) for c in costs]  # one separator per value


def segment_row_costs(t: SegmentTable) -> list[int]:
    """Bytes each row adds to the JSON of a contiguous segment table, exact for all rows but
    the first (whose deltas are taken from 0); the spill planner uses these to size archives.
    (Short by the `index_layout` column, 2 bytes a row, for a head of Kafka index files only
    whose `replaced` list alone holds a bundle: a state that lasts until those go.)"""
    costs = _row_costs(_columns(t, _segment_columns(_has_layouts(t))), len(t))
    for i, name in enumerate(t.extra):
        if name:
            costs[i] += len(json.dumps(str(i))) + len(json.dumps(name)) + 2
    return costs


def archive_row_costs(t: ArchiveTable) -> list[int]:
    """Bytes each row adds to the JSON of an archive table (see `segment_row_costs`)."""
    return _row_costs(_columns(t, _ARCHIVE_EXTRA), len(t))


# -- decoding ----------------------------------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    raise _Bad(f"{name} is not a number this format allows")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Bad(f"field {k!r} appears twice")
        out[k] = v
    return out


def load_document(
    data: bytes,
    key: str | None,
    kind: str,
    fields: tuple[str, ...],
    optional: tuple[str, ...] = (),
    *,
    newest: int = FORMAT_VERSION,
    added: Mapping[int, tuple[str, ...]] | None = None,
) -> dict[str, Any]:
    """Parse, then check the version first: a newer format than `newest` is refused before its
    fields are interpreted. `fields` are required, `optional` may appear, and `added[v]` are
    required from version `v` on (and unknown before it)."""
    try:
        text = bytes(data).decode("utf-8")
        doc = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError, _Bad) as exc:
        raise CorruptManifest(f"not a valid JSON manifest: {exc}", key=key) from exc
    if not isinstance(doc, dict):
        raise CorruptManifest(f"expected a JSON object, got {type(doc).__name__}", key=key)
    version = doc.get("version")
    if type(version) is not int or version < 1:
        raise CorruptManifest(f"missing or invalid format version {version!r}", key=key)
    if version > newest:
        raise UnsupportedManifestVersion(version, newest, key=key)
    if doc.get("kind") != kind:
        raise CorruptManifest(
            f"expected a {kind!r} manifest, got kind {doc.get('kind')!r}", key=key
        )
    fields = fields + tuple(
        name for since, names in sorted((added or {}).items()) if version >= since
        for name in names)
    missing = [f for f in fields if f not in doc]
    unknown = sorted(set(doc) - set(fields) - set(optional))
    if missing or unknown:
        raise CorruptManifest(
            f"fields: missing {missing or 'none'}, unknown {unknown or 'none'}", key=key
        )
    return doc


def _int(obj: dict[str, Any], name: str, path: str, minimum: int = 0) -> int:
    value = obj.get(name)
    if type(value) is not int or not minimum <= value <= _INT64:
        raise _Bad(f"{path}{name} must be an integer in {minimum}..2**63-1, got {value!r}")
    return value


def _str(obj: dict[str, Any], name: str, path: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise _Bad(f"{path}{name} must be a string, got {type(value).__name__}")
    return value


def _ints(obj: dict[str, Any], name: str, path: str, n: int) -> list[int]:
    values = obj.get(name)
    if not isinstance(values, list) or len(values) != n:
        raise _Bad(f"{path}{name} must be a list of {n} integers")
    if values and set(map(type, values)) != {int}:
        raise _Bad(f"{path}{name} must hold integers only")
    return values


def _col(values: Iterator[int] | list[int], path: str) -> array[int]:
    try:
        return array("q", values)
    except OverflowError as exc:
        raise _Bad(f"{path}: a value does not fit in 64 bits") from exc


def _check_fields(obj: Any, path: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _Bad(f"{path} must be an object")
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise _Bad(f"{path} has unknown fields {unknown}")
    return obj


def _offsets(
    obj: dict[str, Any], path: str, n: int, contiguous: bool
) -> tuple[array[int], array[int]]:
    spans = _ints(obj, "last_offset_from_base", path, n)
    if spans and min(spans) < 0:
        raise _Bad(f"{path}last_offset_from_base holds a negative span")
    if contiguous:
        b0 = _int(obj, "base_offset", path)
        cum = list(accumulate(map((1).__add__, spans), initial=b0))
        return _col(cum[:-1], path + "base_offset"), _col(map((-1).__add__, cum[1:]), path)
    base = _ints(obj, "base_offsets", path, n)
    return _col(base, path + "base_offsets"), _col(map(add, base, spans), path + "last_offset")


def _timestamps(obj: dict[str, Any], path: str, n: int) -> tuple[array[int], array[int]]:
    ts0 = list(accumulate(_ints(obj, "base_timestamp_delta", path, n)))
    ts1 = map(add, ts0, _ints(obj, "max_timestamp_from_base", path, n))
    return _col(ts0, path + "base_timestamp"), _col(ts1, path + "max_timestamp")


def _decode_segments(obj: Any, path: str, *, contiguous: bool = True,
                     layouts: bool = False) -> SegmentTable:
    """`layouts`: the document's version has the `index_layout` column."""
    offsets_field = "base_offset" if contiguous else "base_offsets"
    allowed = {"count", offsets_field, "names", *_SEGMENT_COLUMNS}
    if not contiguous:
        allowed.add("replaced_at")
    if layouts:
        allowed.add(_LAYOUT[0])
    obj = _check_fields(obj, path.rstrip("."), allowed)
    n = _int(obj, "count", path)
    base, last = _offsets(obj, path, n, contiguous)
    ts0, ts1 = _timestamps(obj, path, n)
    cols = [base, last, ts0, ts1, *_decode_extra(obj, path, n, _SEGMENT_EXTRA)]
    if layouts:
        layout = _ints(obj, _LAYOUT[0], path, n)
        if any(v not in INDEX_LAYOUTS for v in layout):
            raise _Bad(f"{path}{_LAYOUT[0]} holds a layout other than {list(INDEX_LAYOUTS)}")
        cols.append(_col(layout, path + _LAYOUT[0]))
    else:
        cols.append(array("q", bytes(8 * n)))
    names_obj = obj.get("names")
    if not isinstance(names_obj, dict):
        raise _Bad(f"{path}names must be an object")
    names = [""] * n
    for index, name in names_obj.items():
        good_index = index.isascii() and index.isdecimal() and int(index) < n
        if not good_index or not isinstance(name, str) or not name:
            raise _Bad(f"{path}names: bad entry {index!r}")
        names[int(index)] = name
    return SegmentTable(cols, names)


def _decode_extra(obj: dict[str, Any], path: str, n: int, extra: tuple[_Column, ...]
                  ) -> list[array[int]]:
    """The columns past the offsets and timestamps, in the model's order."""
    out = []
    for stored, model, delta in extra:
        values = _ints(obj, stored, path, n)
        out.append(_col(accumulate(values) if delta else values,
                        path + (model if delta else stored)))
    return out


def _decode_archives(obj: Any, path: str) -> ArchiveTable:
    obj = _check_fields(obj, path.rstrip("."), {"count", "base_offset", *_ARCHIVE_COLUMNS})
    n = _int(obj, "count", path)
    base, last = _offsets(obj, path, n, True)
    ts0, ts1 = _timestamps(obj, path, n)
    cols = [base, last, ts0, ts1, *_decode_extra(obj, path, n, _ARCHIVE_EXTRA)]
    return ArchiveTable(cols)


def _identity(doc: dict[str, Any]) -> tuple[str, int, str]:
    try:
        return (
            keys.validate_topic_name(doc["topic"]),
            keys.validate_partition(doc["partition"]),
            keys.validate_revision(doc["revision"]),
        )
    except InvalidName as exc:
        raise _Bad(str(exc)) from exc


def _guarded(key: str | None, parse: Callable[[], Any]) -> Any:
    try:
        return parse()
    except _Bad as exc:
        raise CorruptManifest(str(exc), key=key) from exc


def decode_partition_manifest(data: bytes, *, key: str | None = None) -> PartitionManifest:
    """Parse and validate a head manifest; `key` is named in every error."""
    doc = load_document(data, key, KIND_PARTITION, _HEAD_FIELDS, newest=HEAD_FORMAT_VERSION,
                        added={2: ("gc_cutoff_ms",), 3: ("collectable_below",)})

    def parse() -> PartitionManifest:
        topic, partition, revision = _identity(doc)
        rep = doc["replaced"]
        layouts = doc["version"] >= 4
        replaced_rows = _decode_segments(rep, "replaced.", contiguous=False, layouts=layouts)
        replaced_at = _ints(rep, "replaced_at", "replaced.", len(replaced_rows))
        return PartitionManifest(
            topic=topic,
            partition=partition,
            revision=revision,
            term=_int(doc, "term", ""),
            sequence=_int(doc, "sequence", ""),
            start_offset=_int(doc, "start_offset", ""),
            last_offset=_int(doc, "last_offset", "", minimum=-1),
            archive_start_offset=_int(doc, "archive_start_offset", ""),
            archive_clean_offset=_int(doc, "archive_clean_offset", ""),
            cloud_bytes=_int(doc, "cloud_bytes", ""),
            segments=_decode_segments(doc["segments"], "segments.", layouts=layouts),
            replaced=tuple(
                ReplacedSegment(seg, at) for seg, at in zip(replaced_rows, replaced_at, strict=True)
            ),
            archives=_decode_archives(doc["archives"], "archives."),
            gc_cutoff_ms=_int(doc, "gc_cutoff_ms", "") if "gc_cutoff_ms" in doc else 0,
            collectable_below=(_int(doc, "collectable_below", "")
                               if "collectable_below" in doc else 0),
        )

    m: PartitionManifest = _guarded(key, parse)
    problem = manifest_problem(m)
    if problem:
        raise CorruptManifest(problem, key=key)
    return m


def decode_archived_manifest(data: bytes, *, key: str | None = None) -> ArchivedManifest:
    """Parse and validate an archived manifest (checksum and range checks against the entry
    that pointed here are the caller's: see `ManifestStore.archived`)."""
    doc = load_document(data, key, KIND_ARCHIVE, _ARCHIVE_FIELDS, ("segments", "archives"),
                        newest=ARCHIVE_FORMAT_VERSION)

    def parse() -> ArchivedManifest:
        topic, partition, revision = _identity(doc)
        level = _int(doc, "level", "")
        rows_field = "segments" if level == 0 else "archives"
        if set(doc) != {*_ARCHIVE_FIELDS, rows_field}:
            raise _Bad(f"a level {level} archived manifest has exactly the field {rows_field!r}")
        term = _int(doc, "term", "")
        if level == 0:
            segments = _decode_segments(doc["segments"], "segments.",
                                        layouts=doc["version"] >= 2)
            return ArchivedManifest(topic, partition, revision, term, level, segments=segments)
        children = _decode_archives(doc["archives"], "archives.")
        return ArchivedManifest(topic, partition, revision, term, level, children=children)

    a: ArchivedManifest = _guarded(key, parse)
    problem = archived_problem(a)
    if problem:
        raise CorruptManifest(problem, key=key)
    return a
