"""One cache directory, several processes: the daemon, `tiered fetch` runs and Spark tasks on
one host all read through the same `[cache] dir`. Each process trims, evicts, writes and, at
start, walks and tidies that directory while the others do the same; none may fail for it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cache import disk

#: several processes on one cache directory: the slow tier
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

#: one process: open the cache (the start-up walk), read random ranges with small limits (so
#: chunks are written, evicted and their directories emptied), check every byte, close
CHILD = textwrap.dedent("""\
    import random, sys, time
    from cache_fakes import Fetcher, layout, make_segment, verifier
    from cache.accounting import CacheSettings
    from cache.chunk_cache import ChunkCache

    root, seed, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    rng = random.Random(seed)
    segments = {f"ab12cd34/kafka/t/0_7/{n * 1024}-{n * 1024 + 1023}-1.log":
                make_segment(batches=64, base_offset=n * 1024) for n in range(4)}
    settings = CacheSettings(size_bytes=6 * 4096, chunk_size=4096)
    deadline = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < deadline:
        with ChunkCache(root, settings, Fetcher(segments), strategy="eager",
                        disk_capacity=1 << 40) as cache:
            for _ in range(20):
                key, data = rng.choice(sorted(segments.items()))
                seg = cache.open_segment(key, len(data), layout(data, 4096), verifier(key))
                begin = rng.randrange(len(data))
                end = min(len(data), begin + rng.randrange(1, 9000))
                if seg.read(begin, end) != data[begin:end]:
                    sys.exit(f"wrong bytes for {key}[{begin}:{end}]")
            cache.maintain()
        rounds += 1
    print(rounds)
    """)


def test_processes_sharing_a_cache_directory_never_trip_over_each_other(
        tmp_path: Path) -> None:
    root = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(seed), "3"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        for seed in range(4)
    ]
    results = [child.communicate(timeout=120) for child in children]
    for child, (out, err) in zip(children, results, strict=True):
        assert child.returncode == 0, err[-3000:]
        assert int(out) > 1  # each went through several start-up walks
    # nothing half-written is left behind, and what is there is whole chunks
    assert not [p for p in root.rglob(f"*{disk.TMP_MARK}*")]


def test_a_fresh_temporary_file_is_left_alone_and_an_old_one_removed(tmp_path: Path) -> None:
    chunks = tmp_path / "seg.log_chunks"
    chunks.mkdir()
    fresh, old = chunks / f"0{disk.TMP_MARK}aaaa", chunks / f"4096{disk.TMP_MARK}bbbb"
    fresh.write_bytes(b"another process is writing this")
    old.write_bytes(b"a crash left this")
    past = time.time() - disk.TMP_STALE_S - 1
    os.utime(old, (past, past))
    assert disk.load_entries(tmp_path) == []
    assert fresh.exists() and not old.exists()


def test_an_empty_directory_is_removed_only_once_stale(tmp_path: Path) -> None:
    """A directory another process has just made (its file not yet opened in it) stays: only
    one untouched for the stale age goes (its parent, just changed by that, at a later walk)."""
    fresh = tmp_path / "ab12cd34" / "kafka" / "t" / "0_7" / "0-9-1.log_chunks"
    old = tmp_path / "old" / "kafka" / "t" / "0_7" / "0-9-1.log_chunks"
    fresh.mkdir(parents=True)
    old.mkdir(parents=True)
    past = time.time() - disk.TMP_STALE_S - 1
    for directory in [old, *old.parents]:
        if directory == tmp_path:
            break
        os.utime(directory, (past, past))
    assert disk.load_entries(tmp_path) == []
    assert fresh.is_dir()
    assert not old.exists() and old.parent.is_dir()


def test_a_walk_between_the_levels_of_a_new_directory_tree_does_not_undo_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process's start-up walk runs after every directory this write makes: the
    levels made so far are fresh, so the walk leaves them and the write goes through."""
    target = tmp_path / "ab12cd34" / "kafka" / "t" / "0_7" / "0-9-1.log_chunks" / "0"
    real_mkdir = os.mkdir

    def mkdir_then_walk(path: str | os.PathLike[str], mode: int = 0o777, **kw: object) -> None:
        real_mkdir(path, mode, **kw)  # type: ignore[arg-type]
        disk.load_entries(tmp_path)

    monkeypatch.setattr(os, "mkdir", mkdir_then_walk)
    disk.write_atomically(target, b"chunk bytes")
    assert target.read_bytes() == b"chunk bytes"


def test_a_write_whose_directory_another_process_removed_is_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "seg.log_chunks" / "0"
    real_open = os.open
    calls: list[object] = []

    def open_after_a_cleanup(path: str | os.PathLike[str], flags: int, mode: int = 0o777,
                             **kw: object) -> int:
        if not calls:  # between its mkdir and its open, another process's walk runs
            calls.append(path)
            Path(path).parent.rmdir()
        return real_open(path, flags, mode)

    monkeypatch.setattr(disk.os, "open", open_after_a_cleanup)
    disk.write_atomically(target, b"chunk bytes")
    assert calls and target.read_bytes() == b"chunk bytes"
