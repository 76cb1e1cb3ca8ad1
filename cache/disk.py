"""The cache directory on disk: chunk paths, atomic writes, and the rebuild after a restart.

Layout (as Redpanda's chunk cache): a chunk of segment object `key` starting at byte `s` lives at
`{cache dir}/{key}_chunks/{s}`; a whole segment (chunk reads disabled) at `{cache dir}/{key}`.
Files appear only complete: bytes go to a temporary file beside the target, then `os.replace`.
Each file is checksummed per `BLOCK` bytes (CRC-32C), so a read checks only the blocks it
serves instead of re-reading a 16 MiB chunk for a 1 MiB fetch. A small index
(`.tiered-cache-index.json`, also replaced atomically) remembers access times and checksums
across restarts; files are the truth for what exists and how big it is, the index only adds
what a file cannot say. Temporary files left by a crash are removed on start.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import crc32c

from cache.errors import CacheError, CacheFullError
from cache.eviction import ChunkId
from tiered.kafka.records import Buffer

__all__ = [
    "BLOCK",
    "INDEX_NAME",
    "DiskEntry",
    "MissingFile",
    "Writer",
    "block_crcs",
    "check_key",
    "chunk_path",
    "create_beside",
    "load_entries",
    "move_into_place",
    "read_checked",
    "remove_file",
    "save_index",
    "write_atomically",
    "write_beside",
    "write_error",
]

INDEX_NAME = ".tiered-cache-index.json"
INDEX_VERSION = 1
#: infix of temporary files; anything carrying it is a leftover of an interrupted write
TMP_MARK = ".tmp-"
CHUNKS_SUFFIX = "_chunks"
#: bytes covered by one stored checksum
BLOCK = 1024 * 1024
#: a temporary file older than this (seconds) is a crash's leftover; a younger one may be
#: another process's write in progress (processes on one host share the cache directory)
TMP_STALE_S = 600.0
#: attempts to create a file whose directory another process removed meanwhile (its start-up
#: walk deletes directories it finds empty and stale)
_CREATE_ATTEMPTS = 10

#: `os.write`-shaped function, injectable so tests can simulate a full disk
Writer = Callable[[int, memoryview], int]


@dataclass
class DiskEntry:
    """A cached file found on disk: its chunk, size (bytes), access time (seconds since the
    epoch) and per-block CRC-32Cs when the index remembers them."""

    chunk: ChunkId
    size: int
    atime: float
    crcs: tuple[int, ...] | None = None


class BadFile(Exception):
    """A cached file is missing, of the wrong size or fails a block checksum."""


class MissingFile(BadFile):
    """A cached file is gone: usually another process sharing the directory evicted it."""


def block_crcs(data: Buffer) -> tuple[int, ...]:
    """CRC-32C of every `BLOCK` bytes of `data` (the last block may be shorter)."""
    with memoryview(data) as view:
        return tuple(crc32c.crc32c(view[i : i + BLOCK]) for i in range(0, len(view), BLOCK))


def read_checked(path: Path, size: int, crcs: Sequence[int], begin: int, end: int) -> bytes:
    """Bytes [begin, end) of the `size`-byte file at `path`, reading and checking only the
    blocks that hold them. BadFile when the file is gone, has another size or a block's
    checksum does not match; CacheError for other I/O errors."""
    first, last = begin // BLOCK, max(begin, end - 1) // BLOCK
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size != size:
                raise BadFile(f"{os.fstat(f.fileno()).st_size} bytes on disk, expected {size}")
            if begin == end:
                return b""
            f.seek(first * BLOCK)
            data = f.read(min(size, (last + 1) * BLOCK) - first * BLOCK)
    except FileNotFoundError as err:
        raise MissingFile("file is missing") from err
    except OSError as err:
        raise CacheError(f"cannot read cached file {path}: {err}") from err
    view = memoryview(data)
    for n, block in enumerate(range(first, last + 1)):
        if crc32c.crc32c(view[n * BLOCK : (n + 1) * BLOCK]) != crcs[block]:
            raise BadFile(f"block {block} fails its CRC-32C")
    return data[begin - first * BLOCK : end - first * BLOCK]


def check_key(key: str) -> str:
    """`key` if it is safe as a relative path under the cache directory; CacheError for a key
    that could escape it or collide with the cache's own files."""
    parts = key.split("/")
    if (
        not key
        or "\0" in key
        or "\\" in key
        or any(p in ("", ".", "..") for p in parts)
        or parts[0] == INDEX_NAME
        or TMP_MARK in parts[-1]
    ):
        raise CacheError(f"segment key {key!r} is not usable as a cache path")
    return key


def chunk_path(root: Path, chunk: ChunkId) -> Path:
    """Where `chunk` lives under the cache directory `root`."""
    if chunk.whole:
        return root / chunk.segment
    return root / f"{chunk.segment}{CHUNKS_SUFFIX}" / str(chunk.start)


def _write_all(fd: int, data: Buffer, write: Writer) -> None:
    view = memoryview(data)
    while view:
        written = write(fd, view)
        view = view[written:]


def ensure_writable(root: Path) -> None:
    """Create the cache directory if needed and prove a file can be written in it, so a bad
    `[cache] dir` (read-only, not creatable, not a directory) is one clear error at start-up
    rather than a failure on every chunk later. Raises `CacheError`."""
    probe = root / f".write-check{TMP_MARK}{uuid.uuid4().hex}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
        probe.unlink()
    except OSError as err:
        raise CacheError(
            f"cache directory {root} is not usable: {err.strerror or err}; set [cache] dir to "
            "a writable directory"
        ) from err


def create_beside(path: Path, mode: int = os.O_WRONLY) -> tuple[Path, int]:
    """A new temporary file beside `path` (its directory created as needed), open with `mode`:
    its path and descriptor. Another process may remove the directory, found empty, between
    the two steps: that is retried."""
    tmp = path.with_name(f"{path.name}{TMP_MARK}{uuid.uuid4().hex}")
    for attempt in range(_CREATE_ATTEMPTS):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return tmp, os.open(tmp, mode | os.O_CREAT | os.O_EXCL, 0o644)
        except (FileNotFoundError, FileExistsError):
            # removed between our mkdir and open, or between mkdir's "exists" and its check
            if attempt == _CREATE_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def write_atomically(path: Path, data: Buffer, *, write: Writer = os.write) -> None:
    """Write `data` to `path` so that readers see either no file or all of it. A full disk
    raises CacheFullError and any other OS error CacheError; the temporary file is removed
    either way, so nothing partial stays behind."""
    tmp = write_beside(path, data, write=write)
    try:
        move_into_place(tmp, path)
    except CacheError:
        remove_file(tmp)
        raise


def write_beside(path: Path, data: Buffer, *, write: Writer = os.write) -> Path:
    """Write `data` to a new temporary file beside `path` and return that file's path, for
    `move_into_place`. Errors as `write_atomically`'s, nothing left behind."""
    tmp: Path | None = None
    try:
        tmp, fd = create_beside(path)
        try:
            _write_all(fd, data, write)
        finally:
            os.close(fd)
    except OSError as err:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise write_error(path, err, len(memoryview(data))) from err
    return tmp


def move_into_place(tmp: Path, path: Path) -> None:
    """Rename a file `write_beside` wrote to `path`: readers see all of it or nothing."""
    try:
        os.replace(tmp, path)
    except OSError as err:
        raise write_error(path, err) from err


def write_error(path: Path, err: OSError, size: int | None = None) -> CacheError:
    """The cache's error for `err` met writing `path` (`size` bytes): CacheFullError for a
    full disk."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        what = "" if size is None else f" ({size} bytes)"
        return CacheFullError(f"cache disk is full writing {path}{what}: {err.strerror}")
    return CacheError(f"cannot write cache file {path}: {err}")


def remove_file(path: Path) -> None:
    """Delete a cached file; one already gone is fine."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def save_index(root: Path, entries: Iterable[DiskEntry], *, write: Writer = os.write) -> None:
    """Persist access times and checksums of `entries` (atomically replaced)."""
    body = {
        "version": INDEX_VERSION,
        "chunks": [
            {
                "path": chunk_path(Path(""), e.chunk).as_posix(),
                "size": e.size,
                "atime": e.atime,
                "crcs": None if e.crcs is None else list(e.crcs),
            }
            for e in entries
        ],
    }
    write_atomically(root / INDEX_NAME, json.dumps(body).encode(), write=write)


def _read_index(root: Path) -> dict[str, tuple[int, float, tuple[int, ...] | None]]:
    """path -> (size, atime, crcs) from the index; empty when it is missing or unreadable (the
    files alone still rebuild the cache, only with mtimes and unknown checksums)."""
    try:
        body = json.loads((root / INDEX_NAME).read_bytes())
        if body.get("version") != INDEX_VERSION:
            return {}
        out: dict[str, tuple[int, float, tuple[int, ...] | None]] = {}
        for item in body["chunks"]:
            size, crcs = int(item["size"]), item.get("crcs")
            if crcs is not None and len(crcs) != -(-size // BLOCK):
                crcs = None  # not this file's: verify it again instead
            out[str(item["path"])] = (
                size,
                float(item["atime"]),
                None if crcs is None else tuple(int(c) for c in crcs),
            )
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _chunk_of(relative: str) -> ChunkId:
    parent, _, name = relative.rpartition("/")
    if parent.endswith(CHUNKS_SUFFIX) and name.isdigit():
        return ChunkId(parent.removesuffix(CHUNKS_SUFFIX), int(name))
    return ChunkId(relative, 0, whole=True)


def load_entries(root: Path) -> list[DiskEntry]:
    """Every cached file under `root`, with access times and checksums from the index where it
    knows the file at its current size (else the file's mtime and no checksum). Removes
    temporary files and empty directories that a crash or eviction left, once they are stale."""
    index = _read_index(root)
    entries: list[DiskEntry] = []
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = Path(dirpath) / name
            if TMP_MARK in name:
                _remove_if_stale(path)
                continue
            relative = path.relative_to(root).as_posix()
            if relative == INDEX_NAME:
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            known = index.get(relative)
            if known is not None and known[0] == st.st_size:
                entries.append(DiskEntry(_chunk_of(relative), st.st_size, known[1], known[2]))
            else:
                entries.append(DiskEntry(_chunk_of(relative), st.st_size, st.st_mtime))
        if Path(dirpath) != root:
            _remove_if_stale_and_empty(Path(dirpath))
    return entries


def _remove_if_stale_and_empty(directory: Path) -> None:
    """Remove a directory left empty, once nothing has been added to or taken from it for the
    stale age. A fresh one may be another process's, made by its `mkdir` and about to get its
    file: removing it there would only make that process retry."""
    with contextlib.suppress(OSError):  # gone, or not empty: another process's
        if time.time() - directory.stat().st_mtime > TMP_STALE_S:
            os.rmdir(directory)


def _remove_if_stale(path: Path) -> None:
    """Remove a temporary file left by a crash, not one another process is writing."""
    try:
        if time.time() - path.stat().st_mtime > TMP_STALE_S:
            path.unlink()
    except FileNotFoundError:
        pass
