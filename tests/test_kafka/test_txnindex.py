"""The transaction index: Kafka's 34-byte entries, the writer indexing aborts as the broker
does (the entry goes beside the marker, first offset and LSO from the open transactions, also
after a reopen), and the search a read_committed fetch makes over segments."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tiered.errors import CorruptSegmentError
from tiered.kafka.log_writer import LogWriter, ProducerRecord
from tiered.kafka.segment import TXNINDEX_SUFFIX, segment_file_name
from tiered.kafka.txnindex import AbortedSearch, AbortedTxn, encode_txnindex, parse_txnindex


def test_entries_round_trip_in_kafkas_layout() -> None:
    entries = [AbortedTxn(7, 10, 20, 21), AbortedTxn(9, 0, 30, 5)]
    data = encode_txnindex(entries)
    # version int16, then producer id, first, last and LSO as int64s (Kafka's AbortedTxn)
    assert data[:34] == struct.pack(">hqqqq", 0, 7, 10, 20, 21)
    assert len(data) == 68
    assert parse_txnindex(data) == entries
    assert parse_txnindex(b"") == []


@pytest.mark.parametrize(("data", "problem"), [
    (encode_txnindex([AbortedTxn(1, 2, 3, 4)])[:-1], "not a multiple of 34"),
    (struct.pack(">hqqqq", 1, 1, 2, 3, 4), "version 1"),
    (struct.pack(">hqqqq", 0, 1, 9, 3, 4), "first offset 9 after its marker at 3"),
])
def test_bad_entries_are_corrupt(data: bytes, problem: str) -> None:
    with pytest.raises(CorruptSegmentError, match=problem) as err:
        parse_txnindex(data, path="x.txnindex")
    assert err.value.path == "x.txnindex"


def _txn(w: LogWriter, pid: int, values: list[bytes]) -> None:
    w.append([ProducerRecord(v) for v in values], producer_id=pid, producer_epoch=0,
             base_sequence=0, transactional=True)


def _index(directory: Path, base: int) -> list[AbortedTxn]:
    path = directory / segment_file_name(base, TXNINDEX_SUFFIX)
    return parse_txnindex(path.read_bytes()) if path.exists() else []


def test_writer_indexes_aborts_beside_their_markers(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    with LogWriter(d, clock=lambda: 1.7e9, fsync=False, segment_bytes=300) as w:
        _txn(w, 1, [b"a" * 50, b"b" * 50])  # 0-1, producer 1 opens
        _txn(w, 2, [b"c" * 50])  # 2, producer 2 opens
        w.append_control("abort", producer_id=1, producer_epoch=0)  # 3
        w.append([ProducerRecord(b"plain")])  # 4, not transactional
        w.append_control("commit", producer_id=2, producer_epoch=0)  # 5
        _txn(w, 1, [b"d"])  # 6
        w.append_control("abort", producer_id=1, producer_epoch=0)  # 7
        bases = w.segment_base_offsets
    entries = {base: _index(d, base) for base in bases}
    marker3 = next(b for b in reversed(bases) if b <= 3)
    marker7 = next(b for b in reversed(bases) if b <= 7)
    # producer 2 was still open at 3: the LSO stays at its first offset
    assert AbortedTxn(1, 0, 3, 2) in entries[marker3]
    assert AbortedTxn(1, 6, 7, 8) in entries[marker7]
    assert sum(len(e) for e in entries.values()) == 2  # commits are not indexed


def test_a_reopened_writer_rebuilds_open_transactions(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    with LogWriter(d, clock=lambda: 1.7e9, fsync=False) as w:
        w.append([ProducerRecord(b"x")])
        _txn(w, 5, [b"a", b"b"])  # 1-2
    with LogWriter(d, clock=lambda: 1.7e9, fsync=False) as w:
        _txn(w, 5, [b"c"])  # 3: same transaction
        w.append_control("abort", producer_id=5, producer_epoch=0)  # 4
    assert _index(d, 0) == [AbortedTxn(5, 1, 4, 5)]


def test_search_takes_overlapping_entries_until_the_lso_passes_the_range() -> None:
    search = AbortedSearch(start=100, upper=200)
    # ends before the range; overlaps; starts at the range end: only the middle one counts
    assert not search.add([AbortedTxn(1, 10, 99, 50), AbortedTxn(2, 150, 160, 120)])
    assert not search.add([AbortedTxn(3, 200, 210, 150)])
    # a marker far after the range of a transaction that began inside it
    assert search.add([AbortedTxn(4, 190, 500, 200), AbortedTxn(5, 195, 600, 600)])
    assert search.found == [AbortedTxn(2, 150, 160, 120), AbortedTxn(4, 190, 500, 200)]
    assert search.complete
