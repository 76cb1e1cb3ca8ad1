"""Bytes one stage of a job hands to a later one through the executor's disk, not through Spark.

A segment's bytes passed from stage to stage inside an RDD are pickled into the JVM, persisted
or shuffled there and unpickled again by the next Python worker: for compaction that was every
cleaned segment going through the JVM twice (docs/compaction.md, "Where the time goes"). A
stage instead writes them to a file under the executor's Spark files directory (removed when
the application ends) and passes on only the path, the size and the CRC-32C. A later task that
runs on the same machine reads the file back; one that runs elsewhere, or finds the file gone
or not the bytes it was told of, gets None and rebuilds the bytes from the bucket. So a spill
is only ever a shortcut: nothing depends on it being there. A run's files that no later stage
read back go when the run ends (`discard_run`, on each machine a task of it reaches), and the
rest with the application.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from pathlib import Path

import crc32c

log = logging.getLogger(__name__)

#: the directory under the Spark files root that a job's spills go to
SPILL_DIR = "tiered-spill"
#: free space a spill never takes from its disk, as a share of the disk and at least
#: `SPILL_RESERVE_MIN`: every segment of a job is spilled before the first is read back, and
#: Spark's own shuffle files need the same disk; past that the bytes are read again instead
SPILL_RESERVE_SHARE = 0.2
SPILL_RESERVE_MIN = 1 << 30


def new_job_tag() -> str:
    """A name for one run of a job: its spill files never meet another run's."""
    return uuid.uuid4().hex


def _root() -> Path | None:
    """The executor's Spark files directory, None outside a Spark worker (then nothing
    spills)."""
    try:
        from pyspark import SparkFiles

        if not SparkFiles._is_running_on_worker:
            return None
        return Path(SparkFiles.getRootDirectory()) / SPILL_DIR
    except Exception:  # no Spark here, or a worker that was not told its directory
        return None


def spill_path(name: str) -> str | None:
    """Where a spill named `name` lies on this machine (None outside a Spark worker)."""
    root = _root()
    return None if root is None else str(root / name)


def spill(name: str, data: bytes) -> str | None:
    """Write `data` under `name` (written whole, then renamed into place) and return its path;
    None when there is no Spark worker directory, the disk would keep less than its reserve
    free, or the write fails (the caller then carries the bytes itself or rebuilds them)."""
    root = _root()
    if root is None:
        return None
    path = root / name
    tmp = root / f".{name}.{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        disk = shutil.disk_usage(root)
        if disk.free - len(data) < max(SPILL_RESERVE_MIN, disk.total * SPILL_RESERVE_SHARE):
            return None  # the disk is for the shuffle first
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not spill %d bytes to %s (%s); carrying them instead", len(data),
                    path, exc)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return str(path)


def unspill(path: str | None, size: int, checksum: int, *, keep: bool = False) -> bytes | None:
    """The bytes spilled at `path` if they are on this machine and are exactly `size` bytes
    with CRC-32C `checksum`, else None (another machine's spill, a file gone, a torn write).
    The file is removed once read unless `keep`."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(size + 1)
    except OSError:
        return None
    if len(data) != size or crc32c.crc32c(data) != checksum:
        return None
    if not keep:
        discard(path)
    return data


def discard(path: str | None) -> None:
    """Remove a spill file if it is here (what another machine spilled is left to its
    application's end)."""
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def discard_run(tag: str) -> int:
    """Remove every spill of the run `tag` on this machine, written whole or not: what its
    stages did not read back (a segment that joined no group, a partition left alone, a dry
    run). Returns how many files went."""
    root = _root()
    if root is None or not root.is_dir():
        return 0
    gone = 0
    for path in (*root.glob(f"{tag}-*"), *root.glob(f".{tag}-*")):
        with contextlib.suppress(OSError):
            path.unlink()
            gone += 1
    return gone
