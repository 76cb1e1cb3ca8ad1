"""Manifest JSON (manifests.serde): round trips, versioning, and refusal of bad bytes.

Defends the bucket format's stability (docs/format.md: versioned, readable by the next
release), design invariant 4 (a manifest with a gap or overlap is refused when read, too) and
design invariant 9 (corrupt or hostile input gets one clear error, never a raw exception).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from manifest_fakes import run_of, segment

from manifests import edits
from manifests.errors import CorruptManifest, UnsupportedManifestVersion
from manifests.manifest import ArchivedManifest, PartitionManifest, manifest_problem
from manifests.model import (
    HEAD_FORMAT_VERSION,
    INDEX_BUNDLE,
    INDEX_LAYOUTS,
    SegmentMeta,
    SegmentTable,
)
from manifests.serde import (
    decode_archived_manifest,
    decode_partition_manifest,
    encode_archived_manifest,
    encode_partition_manifest,
    segment_row_costs,
)
from manifests.spillover import plan_spill

KEY = "20a325ba/meta/kafka/orders/0_abc/manifest.json"


def sample() -> PartitionManifest:
    m = PartitionManifest.new("orders", 0, "abc", term=3)
    m = edits.add_segments(m, [segment(0, 100, term=2), segment(100, 50, term=3, compacted=True)])
    m = edits.add_segments(m, [segment(150, 10, term=3, name="150-159-3-1.log", ts=-1, crc=7)])
    return edits.advance_start_offset(m, 100, now_ms=1_700_000_000_000)


def test_golden_example_from_docs_format_md() -> None:
    """The example in docs/format.md is exactly what the writer produces."""
    m = PartitionManifest.new("orders", 0, "abc", term=2)
    m = edits.add_segments(
        m,
        [
            SegmentMeta(0, 99, 1700000000000, 1700000004000, 1048576, 1, 1, 0x1A2B3C4D),
            SegmentMeta(100, 249, 1700000005000, 1700000009000, 1572864, 2, 2, 0x5E6F7A8B),
        ],
    )
    expected = (
        '{"version":1,"kind":"partition","topic":"orders","partition":0,"revision":"abc",'
        '"term":2,"sequence":0,"start_offset":0,"last_offset":249,"archive_start_offset":0,'
        '"archive_clean_offset":0,"cloud_bytes":2621440,"segments":{"count":2,"base_offset":0,'
        '"last_offset_from_base":[99,149],"base_timestamp_delta":[1700000000000,5000],'
        '"max_timestamp_from_base":[4000,4000],"size_bytes":[1048576,1572864],'
        '"segment_term_delta":[1,1],"writer_term_delta":[1,1],"crc32c":[439041101,1584364171],'
        '"compacted":[0,0],"names":{}},"replaced":{"count":0,"base_offsets":[],'
        '"last_offset_from_base":[],"base_timestamp_delta":[],"max_timestamp_from_base":[],'
        '"size_bytes":[],"segment_term_delta":[],"writer_term_delta":[],"crc32c":[],'
        '"compacted":[],"names":{},"replaced_at":[]},"archives":{"count":0,"base_offset":0,'
        '"last_offset_from_base":[],"base_timestamp_delta":[],"max_timestamp_from_base":[],'
        '"size_bytes":[],"segment_count":[],"crc32c":[],"level":[]}}'
    )
    assert encode_partition_manifest(m).decode() == expected
    assert decode_partition_manifest(expected.encode()) == m


def test_round_trip_of_a_manifest_with_every_feature() -> None:
    m = sample()
    assert m.replaced and any(s.compacted for s in m.segments) and m.segments[-1].name
    back = decode_partition_manifest(encode_partition_manifest(m), key=KEY)
    assert back == m
    assert back.segments[-1].object_name == "150-159-3-1.log"


# -- property-based round trips ------------------------------------------------------------------

TS = st.integers(min_value=-1, max_value=2**41)


@st.composite
def segment_runs(draw: st.DrawFn, start: int, term: int) -> list[SegmentMeta]:
    out: list[SegmentMeta] = []
    base = start
    for _ in range(draw(st.integers(0, 30))):
        count = draw(st.integers(1, 10**6))
        t0 = draw(TS)
        seg_term = draw(st.integers(0, term))
        out.append(
            SegmentMeta(
                base_offset=base,
                last_offset=base + count - 1,
                base_timestamp=t0,
                max_timestamp=t0 + draw(st.integers(0, 10**7)),
                size_bytes=draw(st.integers(0, 2**40)),
                segment_term=seg_term,
                writer_term=draw(st.integers(seg_term, term)),
                checksum=draw(st.integers(0, 2**32 - 1)),
                compacted=draw(st.booleans()),
                name=draw(st.sampled_from(["", "", "", f"{base}-x.log"])),
                index_layout=draw(st.sampled_from(INDEX_LAYOUTS)),
            )
        )
        base += count
    return out


@st.composite
def manifests(draw: st.DrawFn) -> PartitionManifest:
    """Manifests built by random sequences of the real operations, spills included."""
    term = draw(st.integers(0, 2**31))
    m = PartitionManifest.new(
        draw(st.sampled_from(["orders", "a", "x" * 249, "t.-_9"])),
        draw(st.integers(0, 2**31 - 1)),
        draw(st.sampled_from(["0", "VlW-VOROSYi0AhRbbvnJ5g", "12345"])),
        term=term,
    )
    start = draw(st.integers(0, 2**50))
    for _ in range(draw(st.integers(0, 6))):
        action = draw(st.sampled_from(["add", "add", "retain", "merge", "spill"]))
        if action == "add":
            m = edits.add_segments(
                m, draw(segment_runs(m.next_offset if m.last_offset >= 0 else start, term))
            )
        elif action == "retain" and m.last_offset >= 0:
            target = draw(st.integers(m.log_start_offset, m.next_offset))
            m = edits.advance_start_offset(m, target, now_ms=draw(st.integers(0, 2**45)))
        elif action == "merge" and len(m.segments) >= 2:
            a = m.segments[0]
            b = m.segments[1]
            merged = SegmentMeta(
                a.base_offset,
                b.last_offset,
                a.base_timestamp,
                max(a.max_timestamp, b.max_timestamp, a.base_timestamp),
                a.size_bytes + b.size_bytes,
                a.segment_term,
                term,
                1,
                name=f"merged-{a.base_offset}-{b.last_offset}.log",
            )
            m = edits.replace_segments(m, merged, now_ms=5)
        elif action == "spill":
            m = plan_spill(m, draw(st.sampled_from([2048, 4096]))).manifest
    assert manifest_problem(m) is None
    return m


@pytest.mark.slow  # a property over many manifests
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests())
def test_partition_manifest_round_trips(m: PartitionManifest) -> None:
    data = encode_partition_manifest(m)
    assert decode_partition_manifest(data) == m
    assert encode_partition_manifest(decode_partition_manifest(data)) == data  # canonical


@pytest.mark.slow  # a property over many manifests
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(segment_runs(0, 7).filter(bool))
def test_archived_manifest_round_trips(segs: list[SegmentMeta]) -> None:
    a = ArchivedManifest("orders", 1, "9", 7, 0, segments=SegmentTable.from_rows(segs))
    assert decode_archived_manifest(encode_archived_manifest(a)) == a


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 200), st.sampled_from(INDEX_LAYOUTS))
def test_row_cost_estimate_matches_serialized_growth(n: int, layout: int) -> None:
    """The spill planner's per-segment byte estimate is exact for every row after the first
    (the table's `count` field grows by its extra digits)."""
    segs = SegmentTable.from_rows(run_of(10**9, n, index_layout=layout))
    one = SegmentTable.from_rows(run_of(10**9, 1, index_layout=layout))
    m1 = PartitionManifest.new("t", 0, 1).evolve(segments=one)
    mn = PartitionManifest.new("t", 0, 1).evolve(segments=segs)
    growth = len(encode_partition_manifest(mn)) - len(encode_partition_manifest(m1))
    assert growth == sum(segment_row_costs(segs)[1:]) + len(str(n)) - 1


# -- refusals ------------------------------------------------------------------------------------


def test_every_truncation_is_refused_as_corrupt() -> None:
    data = encode_partition_manifest(sample())
    for cut in range(len(data)):
        with pytest.raises(CorruptManifest) as info:
            decode_partition_manifest(data[:cut], key=KEY)
        assert info.value.key == KEY
        assert str(info.value).startswith(KEY)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_random_byte_damage_is_refused_or_harmless(data: st.DataObject) -> None:
    """Any damage yields CorruptManifest or a manifest that still passes every invariant."""
    raw = bytearray(encode_partition_manifest(sample()))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        m = decode_partition_manifest(bytes(raw))
    except CorruptManifest:
        return
    assert manifest_problem(m) is None


def doc() -> dict[str, Any]:
    """The sample head as an older release wrote it: version 1, no retention recorded."""
    loaded: dict[str, Any] = json.loads(encode_partition_manifest(
        sample().evolve(collectable_below=0)))
    return loaded


def encode(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def test_newer_version_is_refused_with_an_upgrade_hint() -> None:
    d = doc()
    d["version"] = HEAD_FORMAT_VERSION + 1
    d["some_future_field"] = {"x": 1}
    with pytest.raises(UnsupportedManifestVersion, match="newer than this reader.*upgrade") as info:
        decode_partition_manifest(encode(d), key=KEY)
    assert info.value.version == HEAD_FORMAT_VERSION + 1 and info.value.key == KEY


def test_gc_cutoff_makes_a_version_2_head_and_round_trips() -> None:
    m = decode_partition_manifest(encode(doc()), key=KEY)
    assert m.gc_cutoff_ms == 0 and json.loads(encode_partition_manifest(m))["version"] == 1
    cut = m.evolve(gc_cutoff_ms=1_700_000_000_000)
    data = encode_partition_manifest(cut)
    doc_ = json.loads(data)
    assert doc_["version"] == 2 and doc_["gc_cutoff_ms"] == 1_700_000_000_000
    assert decode_partition_manifest(data, key=KEY) == cut


def test_gc_cutoff_field_belongs_to_version_2_only() -> None:
    v1 = doc()
    v1["gc_cutoff_ms"] = 5
    with pytest.raises(CorruptManifest, match="unknown \\['gc_cutoff_ms'\\]"):
        decode_partition_manifest(encode(v1), key=KEY)
    v2 = doc()
    v2["version"] = 2
    with pytest.raises(CorruptManifest, match="missing \\['gc_cutoff_ms'\\]"):
        decode_partition_manifest(encode(v2), key=KEY)


def test_a_recorded_start_makes_a_version_3_head_and_round_trips() -> None:
    """Retention records why the start moved (`collectable_below`): version 3, with the cutoff
    written too; older heads read as having recorded nothing (0)."""
    m = sample()
    assert m.collectable_below == 100  # advance_start_offset recorded the retention
    doc_ = json.loads(encode_partition_manifest(m))
    assert doc_["version"] == 3 and doc_["collectable_below"] == 100
    assert doc_["gc_cutoff_ms"] == 0
    assert decode_partition_manifest(encode_partition_manifest(m), key=KEY) == m
    assert decode_partition_manifest(encode(doc()), key=KEY).collectable_below == 0
    v2 = doc()
    v2 |= {"version": 2, "gc_cutoff_ms": 0, "collectable_below": 5}
    with pytest.raises(CorruptManifest, match="unknown \\['collectable_below'\\]"):
        decode_partition_manifest(encode(v2), key=KEY)
    v3 = doc()
    v3 |= {"version": 3, "gc_cutoff_ms": 0}
    with pytest.raises(CorruptManifest, match="missing \\['collectable_below'\\]"):
        decode_partition_manifest(encode(v3), key=KEY)


def test_index_bundles_make_a_version_4_head_and_round_trip() -> None:
    """A segment whose indexes travel as one bundle needs the `index_layout` column: version
    4, with the fields of 2 and 3; a head of Kafka index files only stays what older releases
    wrote, and reads back with every segment in that layout."""
    old = decode_partition_manifest(encode(doc()), key=KEY)
    assert all(seg.index_layout == 0 for seg in old.segments)
    assert "index_layout" not in json.loads(encode_partition_manifest(old))["segments"]
    m = edits.add_segments(old, run_of(old.next_offset, 2, index_layout=INDEX_BUNDLE))
    doc_ = json.loads(encode_partition_manifest(m))
    assert doc_["version"] == 4 and doc_["gc_cutoff_ms"] == 0
    assert doc_["collectable_below"] == 0
    assert doc_["segments"]["index_layout"] == [0] * len(old.segments) + [1, 1]
    assert doc_["replaced"]["index_layout"] == [0] * len(old.replaced)  # every table has it
    assert decode_partition_manifest(encode_partition_manifest(m), key=KEY) == m


def test_the_index_layout_column_belongs_to_version_4_and_known_layouts() -> None:
    old = decode_partition_manifest(encode(doc()), key=KEY)
    m = edits.add_segments(old, run_of(old.next_offset, 1, index_layout=INDEX_BUNDLE))
    v4 = json.loads(encode_partition_manifest(m))
    v3 = json.loads(encode_partition_manifest(m)) | {"version": 3}
    with pytest.raises(CorruptManifest, match=r"unknown fields \['index_layout'\]"):
        decode_partition_manifest(encode(v3), key=KEY)
    v4["segments"]["index_layout"][-1] = 7
    with pytest.raises(CorruptManifest, match="index_layout holds a layout other than"):
        decode_partition_manifest(encode(v4), key=KEY)
    v4["segments"]["index_layout"] = [1, 1, 1, 1, 1, 1, 1, 1]
    with pytest.raises(CorruptManifest, match="index_layout must be a list of"):
        decode_partition_manifest(encode(v4), key=KEY)
    del v4["replaced"]["index_layout"]  # within a version the field set is exact
    with pytest.raises(CorruptManifest, match="replaced.index_layout must be a list of"):
        decode_partition_manifest(encode(v4), key=KEY)


def test_an_archived_manifest_of_bundles_is_version_2() -> None:
    files = ArchivedManifest("orders", 1, "9", 7, 0,
                             segments=SegmentTable.from_rows(run_of(0, 3)))
    assert json.loads(encode_archived_manifest(files))["version"] == 1
    bundles = ArchivedManifest("orders", 1, "9", 7, 0, segments=SegmentTable.from_rows(
        run_of(0, 3, index_layout=INDEX_BUNDLE)))
    d = json.loads(encode_archived_manifest(bundles))
    assert d["version"] == 2 and d["segments"]["index_layout"] == [1, 1, 1]
    assert decode_archived_manifest(encode_archived_manifest(bundles)) == bundles
    d["version"] = 1
    with pytest.raises(CorruptManifest, match=r"unknown fields \['index_layout'\]"):
        decode_archived_manifest(encode(d))


def test_archived_manifest_of_a_newer_version_is_refused() -> None:
    a = ArchivedManifest("orders", 1, "9", 7, 0, segments=SegmentTable.from_rows(run_of(0, 3)))
    d = json.loads(encode_archived_manifest(a))
    d["version"] = 99
    with pytest.raises(UnsupportedManifestVersion):
        decode_archived_manifest(encode(d))


def mutate(path: str, value: Any) -> dict[str, Any]:
    d = doc()
    *parents, last = path.split(".")
    target = d
    for p in parents:
        target = target[p]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return d


DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("version", "1", "invalid format version"),
        ("version", 0, "invalid format version"),
        ("version", DELETE, "invalid format version"),
        ("version", True, "invalid format version"),
        ("kind", "archive", "expected a 'partition' manifest"),
        ("term", DELETE, "missing \\['term'\\]"),
        ("extra", 1, "unknown \\['extra'\\]"),
        ("topic", "../x", "topic name"),
        ("topic", 7, "must be a string"),
        ("partition", -1, "partition"),
        ("term", 1.0, "term must be an integer"),
        ("term", 2**64, "term must be an integer"),
        ("last_offset", -2, "last_offset must be an integer in -1"),
        ("cloud_bytes", 1, "cloud_bytes 1 is not the sum"),
        ("start_offset", 5, "start_offset 5 is not inside the first segment"),
        ("segments", [], "segments must be an object"),
        ("segments.count", 3, "must be a list of 3 integers"),
        ("segments.size_bytes", [1, "2"], "must hold integers only"),
        ("segments.size_bytes", [1, True], "must hold integers only"),
        ("segments.size_bytes", [1, 2.5], "must hold integers only"),
        ("segments.crc32c", [2**64, 0], "does not fit in 64 bits"),
        ("segments.crc32c", [2**32, 0], "checksum"),
        ("segments.last_offset_from_base", [-60, 9], "negative span"),
        ("segments.names", {"7": "x.log"}, "names: bad entry"),
        ("segments.names", {"0": "../etc"}, "object name"),
        ("segments.names", [], "names must be an object"),
        ("segments.writer_term_delta", [3, 1], "term newer than the manifest's"),
        ("segments.bogus", [], "unknown fields"),
        ("replaced.replaced_at", [], "must be a list of 1 integers"),
        ("archives.count", 1, "must be a list of 1 integers"),
    ],
)
def test_malformed_fields_are_refused_with_the_field_named(
    path: str, value: Any, message: str
) -> None:
    with pytest.raises(CorruptManifest, match=message):
        decode_partition_manifest(encode(mutate(path, value)), key=KEY)


def test_gap_written_into_the_bucket_is_refused_on_read() -> None:
    d = doc()
    d["replaced"] = json.loads(encode_partition_manifest(PartitionManifest.new("t", 0, 1)))[
        "replaced"
    ]
    d["segments"]["base_offset"] = 0
    d["start_offset"] = 0
    # make segment 1 start one past where segment 0 ends: a non-contiguous table
    d["segments"]["count"] = 2
    for column in (
        "last_offset_from_base",
        "base_timestamp_delta",
        "max_timestamp_from_base",
        "size_bytes",
        "segment_term_delta",
        "writer_term_delta",
        "crc32c",
        "compacted",
    ):
        d["segments"][column] = d["segments"][column][1:]
    d["segments"]["names"] = {}
    with pytest.raises(CorruptManifest):
        decode_partition_manifest(encode(d))


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xff\xfe{}",
        b"[]",
        b"null",
        b'{"version": NaN}',
        b'{"version": Infinity}',
        b'{"version": 1, "version": 1}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"version": 1}',
    ],
)
def test_garbage_is_refused_as_corrupt(raw: bytes) -> None:
    with pytest.raises(CorruptManifest):
        decode_partition_manifest(raw)


def test_manifest_of_another_kind_is_refused() -> None:
    a = ArchivedManifest("orders", 1, "9", 7, 0, segments=SegmentTable.from_rows(run_of(0, 3)))
    with pytest.raises(CorruptManifest, match="expected a 'partition' manifest"):
        decode_partition_manifest(encode_archived_manifest(a))
    with pytest.raises(CorruptManifest, match="expected a 'archive' manifest"):
        decode_archived_manifest(encode_partition_manifest(sample().evolve(collectable_below=0)))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"level": 1}, "exactly the field 'archives'"),
        ({"segments": {"count": 0}}, "must be a list of 0 integers"),
        ({"archives": {}}, "exactly the field 'segments'"),
    ],
)
def test_inconsistent_archived_manifests_are_refused(change: dict[str, Any], message: str) -> None:
    a = ArchivedManifest("orders", 1, "9", 7, 0, segments=SegmentTable.from_rows(run_of(0, 3)))
    d = json.loads(encode_archived_manifest(a))
    d.update(change)
    with pytest.raises(CorruptManifest, match=message):
        decode_archived_manifest(encode(d))


def test_empty_level0_archive_is_refused() -> None:
    a = ArchivedManifest("orders", 1, "9", 7, 0, segments=SegmentTable.empty())
    with pytest.raises(CorruptManifest, match="at least one"):
        decode_archived_manifest(encode_archived_manifest(a))
