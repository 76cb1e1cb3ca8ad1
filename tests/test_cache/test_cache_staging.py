"""A streamed chunk's temporary file or pool buffer: bytes in as they arrive, checked a run of
whole batches at a time (a file's block checksums taken on the way), and a chunk that fails
read to its end before the error so the stream stays at the next chunk."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from cache_fakes import make_segment

from cache.buffers import ChunkBuffers
from cache.chunks import batch_positions, verify_batches
from cache.disk import block_crcs
from cache.staging import BufferedChunk, StagedChunk
from tiered.errors import CorruptSegmentError


@dataclass
class Pieces:
    """A stream handing out `data` in pieces of random sizes (as a socket does)."""

    data: bytes
    pos: int = 0
    seed: int = 5

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def read(self, n: int = -1, /) -> bytes:
        n = min(n, self.rng.randint(1, 300_000))
        got = self.data[self.pos:self.pos + n]
        self.pos += len(got)
        return got

    def readinto(self, b: memoryview, /) -> int:
        got = self.read(len(b))
        b[:len(got)] = got
        return len(got)

    def close(self) -> None:
        pass


Staged = Callable[[Path, int], StagedChunk | BufferedChunk]


def _into_buffer(path: Path, size: int) -> BufferedChunk:
    buffer = ChunkBuffers(16 << 20, 16 << 20).take(size)
    assert buffer is not None
    return BufferedChunk(path, size, buffer)


@pytest.fixture(params=["file", "buffer"])
def staged(request: pytest.FixtureRequest, tmp_path: Path) -> Staged:
    """Makes a chunk of `size` bytes staged into its temporary file, or into a pool buffer."""
    if request.param == "file":
        return StagedChunk
    return _into_buffer


def committed(chunk: StagedChunk | BufferedChunk) -> bytes:
    """The bytes of a filled chunk, committed: its file's, or its buffer's."""
    shared = chunk.commit()
    try:
        if chunk.in_memory:
            return shared.mapping[:chunk.size]
        return chunk.path.read_bytes()
    finally:
        shared.release()


def test_every_byte_lands_and_runs_of_whole_batches_are_checked(tmp_path: Path,
                                                               staged: Staged) -> None:
    data = make_segment(batches=3000, value_size=300)  # about 3.9 MB, past a checksum block
    runs: list[tuple[int, int]] = []

    def check(run: memoryview, offset: int) -> None:
        verify_batches(run, offset)
        runs.append((offset, len(run)))

    chunk = staged(tmp_path / "chunk", len(data))
    chunk.fill(Pieces(data), check)
    # a file's block checksums are taken on the way; a buffer's when it is written
    assert chunk.crcs == (None if chunk.in_memory else block_crcs(data))
    assert committed(chunk) == data
    positions = set(batch_positions(data)) | {len(data)}
    assert runs[0][0] == 0 and sum(n for _, n in runs) == len(data)
    for (offset, n), (following, _) in zip(runs, [*runs[1:], (len(data), 0)], strict=True):
        assert offset + n == following and following in positions


def test_a_batch_bigger_than_a_piece_is_checked_whole(tmp_path: Path, staged: Staged) -> None:
    data = make_segment(batches=3, value_size=700_000)  # batches of about 2.8 MB
    offsets: list[int] = []
    chunk = staged(tmp_path / "chunk", len(data))
    chunk.fill(Pieces(data), lambda run, offset: offsets.append(offset))
    assert offsets == batch_positions(data)[:len(offsets)] and len(offsets) >= 2
    assert committed(chunk) == data


def test_a_failed_check_still_reads_the_chunk_to_its_end(tmp_path: Path,
                                                        staged: Staged) -> None:
    data = make_segment(batches=400)
    following = make_segment(batches=10, base_offset=1600)
    bad = bytearray(data)
    bad[batch_positions(data)[100] + 70] ^= 0xFF
    stream = Pieces(bytes(bad) + following)
    chunk = staged(tmp_path / "chunk", len(data))
    with pytest.raises(CorruptSegmentError, match="CRC-32C"):
        chunk.fill(stream, lambda run, offset: verify_batches(run, offset))
    assert stream.pos == len(data)  # the stream is at the next chunk
    chunk.discard()
    assert list(tmp_path.iterdir()) == []


def test_a_chunk_ending_inside_a_batch_is_corrupt(tmp_path: Path, staged: Staged) -> None:
    data = make_segment(batches=50)
    chunk = staged(tmp_path / "chunk", len(data) - 10)
    with pytest.raises(CorruptSegmentError, match="ends inside a batch"):
        chunk.fill(Pieces(data), lambda run, offset: None)
    chunk.discard()


def test_a_stream_ending_early_is_an_eof(tmp_path: Path, staged: Staged) -> None:
    data = make_segment(batches=50)
    chunk = staged(tmp_path / "chunk", len(data) + 100)
    with pytest.raises(EOFError, match="100 bytes short"):
        chunk.fill(Pieces(data))
    chunk.discard()


def test_a_chunk_larger_than_its_buffer_is_refused_and_the_buffer_given_back() -> None:
    pool = ChunkBuffers(1 << 20, 1 << 20)
    buffer = pool.take(1 << 20)
    assert buffer is not None
    with pytest.raises(ValueError, match="does not fit"):
        BufferedChunk(Path("chunk"), (1 << 20) + 1, buffer)
    assert pool.lent_bytes == 0
