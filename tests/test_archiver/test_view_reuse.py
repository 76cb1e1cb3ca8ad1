"""The controller and local retention build a view of every partition at each pass; an idle
partition's view is built once and reused while its inputs are the same (docs/operations.md,
"CPU and memory"), and built again as soon as any of them moves."""

from __future__ import annotations

import os
import time
from pathlib import Path

from support.archiving import Disk, write_partition
from support.configs import config_over

from archiver.service import Archiver
from archiver.space import PartitionView
from tiered.store.file import FileStore

HOUR_AGO = time.time() - 3600


def age(config_dirs: list[str]) -> None:
    """Make every partition directory's mtime old, as an idle broker's are (a scan re-reads
    a directory changed in the last moments whatever its mtime says)."""
    for d in config_dirs:
        for entry in os.scandir(d):
            if entry.is_dir():
                os.utime(entry.path, (HOUR_AGO, HOUR_AGO))


def view(archiver: Archiver) -> PartitionView:
    archiver.scan()
    views, _, failed = archiver.local_pass.views(archiver._states())
    assert not failed
    (only,) = views
    return only


def test_an_idle_partitions_view_is_reused_and_rebuilt_when_an_input_moves(
        tmp_path: Path) -> None:
    config = config_over(tmp_path)
    log_dir = Path(config.log_dirs[0])
    write_partition(log_dir, "orders", 0, batches=6, segment_bytes=3000)
    age(config.log_dirs)
    archiver = Archiver(config, FileStore(config.store_settings()), disk_usage=Disk())
    first = view(archiver)
    assert view(archiver) is first  # nothing moved: the same object, nothing rebuilt

    # records appended to the active segment (no roll, the directory's mtime unchanged)
    hw = first.active_base_offset
    write_partition(log_dir, "orders", 0, batches=1, segment_bytes=1 << 20,
                    high_watermark=hw)
    age(config.log_dirs)
    grown = view(archiver)
    assert grown is not first and grown.active_size_bytes > first.active_size_bytes
    assert view(archiver) is grown

    # a commit: the view now knows what the bucket covers
    assert grown.uploaded_last_offset is None
    archiver.upload_round()
    uploaded = view(archiver)
    assert uploaded is not grown and uploaded.uploaded_last_offset is not None
