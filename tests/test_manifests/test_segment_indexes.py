"""The index objects beside a segment: the bundle's codec (hostile bytes included) and reading
and writing both layouts through a real store."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from manifest_fakes import segment

from manifests import keys, segment_indexes
from manifests.model import INDEX_BUNDLE, INDEX_FILES
from tiered.errors import CorruptSegmentError
from tiered.store.errors import ObjectNotFound
from tiered.store.file import FileStore

PREFIX = "ab/kafka/orders/0_r/"
SECTIONS = {"index": b"\x00\x00\x00\x05\x00\x00\x10\x00", "timeindex": b"t" * 12,
            "txnindex": b"x" * 34}


@given(st.dictionaries(st.sampled_from(segment_indexes.INDEX_KINDS), st.binary(max_size=300)))
def test_a_bundle_round_trips_and_its_size_is_known(sections: dict[str, bytes]) -> None:
    data = segment_indexes.encode_bundle(sections)
    assert segment_indexes.decode_bundle(data) == sections
    assert len(data) == segment_indexes.bundle_size(map(len, sections.values()))


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_are_refused_as_corrupt(data: bytes) -> None:
    try:
        segment_indexes.decode_bundle(data, path="k")
    except CorruptSegmentError as err:
        assert err.path == "k"


def test_every_truncation_and_every_flipped_byte_is_refused() -> None:
    data = segment_indexes.encode_bundle(SECTIONS)
    for n in range(len(data)):
        with pytest.raises(CorruptSegmentError, match="not an index bundle"):
            segment_indexes.decode_bundle(data[:n])
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x40
        with pytest.raises(CorruptSegmentError):
            segment_indexes.decode_bundle(bytes(damaged))


@pytest.mark.parametrize(("data", "reason"), [
    (b"TIDX\x01\xff", "255 sections"),
    (b"TIDX\x01\x03" + struct.pack(">BII", 1, 0, 0), "do not fit"),
    (b"TIDX\x01\x01" + struct.pack(">BII", 1, 2**32 - 1, 0) + b"abc", "runs past the end"),
    (b"TIDX\x01\x02" + struct.pack(">BII", 1, 0, 0) * 2, "unknown or repeated"),
    (b"TIDX\x01\x01" + struct.pack(">BII", 9, 0, 0), "unknown or repeated"),
    (b"TIDX\x02\x00", "version 2"),
    (b"KFKA\x01\x00", "magic"),
    (b"TIDX\x01\x00junk", "after the last section"),
])
def test_hostile_framing_is_refused_before_anything_is_allocated(data: bytes,
                                                                  reason: str) -> None:
    with pytest.raises(CorruptSegmentError, match=reason):
        segment_indexes.decode_bundle(data)


def test_unknown_kinds_are_never_written() -> None:
    with pytest.raises(ValueError, match="unknown index kinds"):
        segment_indexes.encode_bundle({"offsets": b""})


def test_a_bundle_is_one_object_holding_every_kind(file_store: FileStore) -> None:
    store = file_store
    seg = segment(0, 10, index_layout=INDEX_BUNDLE)
    written = segment_indexes.write_indexes(store, PREFIX, seg.object_name, SECTIONS,
                                            INDEX_BUNDLE)
    assert [key for key, _ in written] == [PREFIX + "0-9-1.indexes"]
    assert [i.key for i in store.list("")] == [PREFIX + "0-9-1.indexes"]
    assert segment_indexes.index_object_names(seg) == ("0-9-1.indexes",)
    got = segment_indexes.read_indexes(store, PREFIX, seg.object_name, seg.index_layout,
                                       ("index", "timeindex", "txnindex"),
                                       segment_bytes=seg.size_bytes)
    assert got == SECTIONS
    # a segment without aborted transactions has no such section: none, not an error
    segment_indexes.write_indexes(store, PREFIX, seg.object_name,
                                  {"index": b"", "timeindex": b""}, INDEX_BUNDLE)
    assert segment_indexes.read_indexes(store, PREFIX, seg.object_name, INDEX_BUNDLE,
                                        ("txnindex",), segment_bytes=seg.size_bytes
                                        ) == {"txnindex": None}


def test_a_missing_bundle_is_damage_not_an_empty_index(file_store: FileStore) -> None:
    store = file_store
    with pytest.raises(ObjectNotFound):
        segment_indexes.read_indexes(store, PREFIX, "0-9-1.log", INDEX_BUNDLE, ("txnindex",),
                                     segment_bytes=100)
    store.put(PREFIX + "0-9-1.indexes", b"TIDX\x01\x01")
    with pytest.raises(CorruptSegmentError, match=r"0-9-1\.indexes"):
        segment_indexes.read_indexes(store, PREFIX, "0-9-1.log", INDEX_BUNDLE, ("index",),
                                     segment_bytes=100)


class _RangeRecorder:
    """A store that remembers the byte range of every GET."""

    def __init__(self, store: FileStore) -> None:
        self.store = store
        self.ranges: list[tuple[int, int] | None] = []

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        self.ranges.append(byte_range)
        return self.store.get(key, byte_range)


@pytest.mark.parametrize("layout", [INDEX_BUNDLE, INDEX_FILES])
def test_an_index_object_larger_than_its_segment_allows_is_never_read_whole(
        file_store: FileStore, monkeypatch: pytest.MonkeyPatch, layout: int) -> None:
    """A damaged bucket may hold anything under an index name: no read brings more than the
    bound the segment's size gives, and an object above it is refused as corrupt."""
    monkeypatch.setattr(segment_indexes, "INDEX_ALLOWANCE", 64)
    seg = segment(0, 10, index_layout=layout)
    store = _RangeRecorder(file_store)
    segment_indexes.write_indexes(file_store, PREFIX, seg.object_name,
                                  {"index": SECTIONS["index"]}, layout)
    got = segment_indexes.read_indexes(store, PREFIX, seg.object_name, layout, ("index",),
                                       segment_bytes=100)
    assert got == {"index": SECTIONS["index"]}
    bound = segment_indexes.index_bytes_bound(100)
    assert bound == 164
    assert store.ranges == [(0, bound + 1)]
    name = keys.index_name(seg.object_name, "indexes" if layout == INDEX_BUNDLE else "index")
    file_store.put(PREFIX + name, b"\0" * 10_000)
    store.ranges.clear()
    with pytest.raises(CorruptSegmentError, match=f"larger than {bound} bytes"):
        segment_indexes.read_indexes(store, PREFIX, seg.object_name, layout, ("index",),
                                     segment_bytes=100)
    assert store.ranges == [(0, bound + 1)]


def test_kafka_index_files_as_earlier_releases_wrote_them(file_store: FileStore) -> None:
    """One object per kind; a kind with no object is none (no `.txnindex` was written for a
    segment without aborted transactions)."""
    store = file_store
    seg = segment(0, 10)
    assert seg.index_layout == INDEX_FILES
    written = segment_indexes.write_indexes(
        store, PREFIX, seg.object_name, {k: SECTIONS[k] for k in ("index", "timeindex")},
        INDEX_FILES)
    assert sorted(key for key, _ in written) == [PREFIX + "0-9-1.index",
                                                  PREFIX + "0-9-1.timeindex"]
    got = segment_indexes.read_indexes(store, PREFIX, seg.object_name, seg.index_layout,
                                       segment_indexes.INDEX_KINDS, segment_bytes=seg.size_bytes)
    assert got == {"index": SECTIONS["index"], "timeindex": SECTIONS["timeindex"],
                   "txnindex": None}
    assert segment_indexes.index_object_names(seg) == tuple(
        keys.index_name("0-9-1.log", k) for k in segment_indexes.INDEX_KINDS)


def test_an_unknown_layout_is_refused(file_store: FileStore) -> None:
    store = file_store
    with pytest.raises(CorruptSegmentError, match="unknown index layout 7"):
        segment_indexes.read_indexes(store, PREFIX, "0-9-1.log", 7, ("index",), segment_bytes=100)


def test_garbage_collection_and_listings_see_a_bundle_as_its_segment_s() -> None:
    assert keys.segment_name_of("0-9-1.indexes") == "0-9-1.log"
    assert "0-9-1.indexes" in keys.with_indexes("0-9-1.log")
