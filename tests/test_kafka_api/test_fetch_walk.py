"""The Fetch answer's own look at what it sends: whether a batch is transactional (for a
read_committed consumer's aborted-transaction list), read from the headers where they lie, and
never led astray by a length it cannot trust; and the Fetch messages loaded ahead of the first
request."""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

import pytest

from cache.fetched_bytes import FilePiece, Pieces
from tiered.app.kafka_api import fetch
from tiered.app.kafka_api.apis import APIS
from tiered.kafka.builder import encode_batch
from tiered.kafka.records import LENGTH_OFFSET, LOG_OVERHEAD, Record


def _batch(offset: int, transactional: bool = False) -> bytes:
    return encode_batch([Record(offset, 1_000, b"k", b"v" * 100)], base_offset=offset,
                        transactional=transactional, producer_id=7 if transactional else -1)


PLAIN = _batch(0) + _batch(1) + _batch(2)
TXN = _batch(0) + _batch(1, transactional=True) + _batch(2)


def _pieces(*parts: bytes | FilePiece) -> Pieces:
    out = Pieces()
    for part in parts:
        out.add(part)
    return out


@pytest.fixture
def log_file(tmp_path: Path) -> tuple[int, mmap.mmap, int]:
    """A file holding 10 junk bytes, PLAIN, then TXN: its descriptor, a mapping of it from
    its start, and where TXN begins."""
    path = tmp_path / "chunk"
    path.write_bytes(b"j" * 10 + PLAIN + TXN)
    fd = os.open(path, os.O_RDONLY)
    mapping = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    yield fd, mapping, 10 + len(PLAIN)
    mapping.close()
    os.close(fd)


def test_a_transactional_batch_is_found_in_bytes_and_in_file_ranges(
        log_file: tuple[int, mmap.mmap, int]) -> None:
    fd, mapping, txn_at = log_file
    assert not fetch._any_transactional(_pieces(PLAIN))
    assert fetch._any_transactional(_pieces(PLAIN, TXN))
    for with_mapping in (mapping, None):  # read from the chunk's mapping, or header by header
        plain = FilePiece(fd, 10, len(PLAIN), with_mapping)
        txn = FilePiece(fd, txn_at, len(TXN), with_mapping)
        assert not fetch._any_transactional(_pieces(plain))
        assert fetch._any_transactional(_pieces(plain, txn))
        assert fetch._any_transactional(_pieces(PLAIN, txn))


def _length(data: bytes, at: int, length: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(">i", out, at + LENGTH_OFFSET, length)
    return bytes(out)


@pytest.mark.parametrize("hostile", [
    _length(PLAIN, 0, -LOG_OVERHEAD),  # a step of 0: the old walk looped here for ever
    _length(PLAIN, 0, -1000),  # a step backwards
    _length(PLAIN, 0, len(PLAIN) * 4),  # past the end
    PLAIN[:-1],  # the last batch truncated
    PLAIN + PLAIN[:30],  # a header truncated
], ids=["zero step", "negative length", "length past the end", "truncated batch",
        "truncated header"])
def test_bytes_that_do_not_walk_as_batches_count_as_transactional(
        hostile: bytes, tmp_path: Path) -> None:
    """The walk never follows a length out of its piece; when it cannot tell, the answer is
    the safe one: look the aborted transactions up (a lookup too many, never one too few)."""
    assert fetch._any_transactional(_pieces(hostile))
    path = tmp_path / "hostile"
    path.write_bytes(hostile)
    fd = os.open(path, os.O_RDONLY)
    try:
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mapping:
            for with_mapping in (mapping, None):
                piece = FilePiece(fd, 0, len(hostile), with_mapping)
                assert fetch._any_transactional(_pieces(piece))
    finally:
        os.close(fd)


def test_every_advertised_fetch_version_is_prepared_ahead() -> None:
    """What the server runs when it starts (on a thread of its own): a request parsed and an
    answer encoded at every Fetch version it advertises."""
    api = APIS[fetch.FETCH]
    fetch.warm_up(range(api.min_version, api.max_version + 1))
    thread = fetch.warm_up_in_background([api.max_version])
    thread.join(timeout=60)
    assert not thread.is_alive()
