"""`tiered demo`: runs in a temporary directory, archives into its `file://` bucket (manifests
committed, objects as the local files), trims local retention, reads the oldest segment back
from the bucket, and continues on a second run."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import crc32c
import pytest
from click.testing import CliRunner

from archiver.service import revision_of
from manifests import ManifestSettings, ManifestStore
from tiered.app.demo import (
    DEMO_PARTITIONS,
    DEMO_TOPIC,
    demo_config,
    read_back_line,
    read_back_segment,
    render_config_toml,
    run_demo,
)
from tiered.cli.main import cli
from tiered.config import load_config
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.local_log import LocalLog
from tiered.store import open_store


def _manifests(base: Path) -> dict[int, list[tuple[int, int, int, int]]]:
    """partition -> [(base, last, size, checksum)] of every segment its manifest names, each
    checked against the object's bytes in the bucket (design invariant 1)."""
    config = demo_config(base)
    out = {}
    with open_store(config.store_settings(), probe=False) as store:
        mstore = ManifestStore(store, ManifestSettings.from_cluster(config.cluster))
        for part in LocalLog(config.log_dirs):
            m, etag = mstore.load(DEMO_TOPIC, part.partition, revision_of(part))
            assert etag is not None, f"no manifest committed for partition {part.partition}"
            rows = []
            for seg in mstore.iter_segments(m):
                data = store.get(m.segment_key(seg))
                assert (len(data), crc32c.crc32c(data)) == (seg.size_bytes, seg.checksum)
                rows.append((seg.base_offset, seg.last_offset, seg.size_bytes, seg.checksum))
            out[part.partition] = rows
    return out


@pytest.mark.slow  # a demo run
def test_demo_command_archives_trims_and_shows(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["-q", "demo"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    base = tmp_path / "tiered-demo"  # the default directory, relative to where it runs
    lines = result.stdout.splitlines()
    assert lines[0].startswith("tiered demo in tiered-demo ")
    assert any(line.startswith("wrote 24,000 records") for line in lines)
    assert any(line.startswith("archived ") for line in lines)
    assert "PARTITION" in result.stdout and "orders-2" in result.stdout
    assert lines[-1] == "next: tiered describe-storage --config tiered-demo/tiered.toml"
    assert len(lines) < 20  # a few readable lines
    # the demo uploads as this node: its rows name it, never "-" beside the role "uploader"
    rows = [line.split() for line in lines if line.strip().startswith("orders-")]
    assert rows and all(r[-1] == "uploader" and r[-2] != "-" for r in rows), result.stdout
    read_back = [line for line in lines if line.startswith("read offsets 0..")]
    assert len(read_back) == 1, result.stdout
    assert re.fullmatch(
        r"read offsets 0\.\.(\d+) of orders-0 back from the bucket \(deleted locally\): "
        r"[\d,]+ records in \d+ batches, byte-identical to what was written "
        r"\(source=remote, [\d.]+ KiB downloaded\)", read_back[0]), read_back[0]

    manifests = _manifests(base)
    assert sorted(manifests) == list(range(DEMO_PARTITIONS))
    for partition, segments in manifests.items():
        assert segments, f"partition {partition} has nothing in the bucket"
        # contiguous from offset 0
        assert segments[0][0] == 0
        for (_, last, _, _), (nxt, _, _, _) in zip(segments, segments[1:], strict=False):
            assert nxt == last + 1


@pytest.mark.slow  # a demo run
def test_demo_enforces_local_retention_only_below_what_the_bucket_holds(tmp_path: Path) -> None:
    result = run_demo(tmp_path / "d", echo=lambda line: None)
    assert result.ok and not result.continued
    assert result.report.deleted_local_segments > 0
    manifests = _manifests(tmp_path / "d")
    for row in result.rows:
        local, remote = row["local"], row["remote"]
        # some of the log left the disk, and everything that left is in the bucket
        assert local["start_offset"] > 0
        assert remote["start_offset"] == 0
        assert remote["last_offset"] >= local["start_offset"] - 1
        assert manifests[row["partition"]][-1][1] == remote["last_offset"]
        target = demo_config(tmp_path / "d").topic_config(DEMO_TOPIC)
        assert target.retention_local_target_bytes is not None
        # the closed local segments beyond the target were trimmed (the active one stays)
        closed_local = local["size_bytes"] - row["pending_bytes"]
        assert closed_local <= target.retention_local_target_bytes


@pytest.mark.slow  # a demo run
def test_demo_reads_the_first_segment_back_from_the_bucket_byte_identical(
    tmp_path: Path,
) -> None:
    result = run_demo(tmp_path / "d", echo=lambda line: None)
    rb = result.read_back
    assert rb is not None and rb.ok and rb.identical and rb.error is None
    assert (rb.topic, rb.partition, rb.first_offset) == (DEMO_TOPIC, 0, 0)
    assert rb.source == "remote"
    # what the demo compared against is the first segment object, which the archiver
    # verified against the local file before uploading it
    first = _manifests(tmp_path / "d")[0][0]
    assert (rb.first_offset, rb.last_offset, rb.size_bytes) == first[:3]
    assert rb.records == rb.last_offset - rb.first_offset + 1  # no compaction in the demo
    assert rb.downloaded_bytes == rb.size_bytes  # one chunk: the whole 256 KiB segment
    local = LocalLog(demo_config(tmp_path / "d").log_dirs)
    assert all(p.log_start_offset is not None and p.log_start_offset > rb.last_offset
               for p in local)


@pytest.mark.slow  # a demo run
def test_read_back_reports_changed_bytes_and_a_missing_object_and_skips_local_data(
    tmp_path: Path,
) -> None:
    base = tmp_path / "d"
    result = run_demo(base, echo=lambda line: None)
    assert result.read_back is not None
    config = demo_config(base)
    part0 = LocalLog(config.log_dirs).partitions[TopicPartition(DEMO_TOPIC, 0)]
    with open_store(config.store_settings(), probe=False) as store:
        mstore = ManifestStore(store, ManifestSettings.from_cluster(config.cluster))
        m, _ = mstore.load(DEMO_TOPIC, 0, revision_of(part0))
        written = bytearray(store.get(m.segment_key(next(iter(mstore.iter_segments(m))))))
        # what was written, off by one byte in the last record: the comparison catches it
        written[-1] ^= 0xFF
        bad = read_back_segment(config, store, 0, 0, bytes(written))
        assert bad is not None and not bad.identical and not bad.ok
        assert read_back_line(bad).startswith("error: offsets 0..")
        # an offset the local log still has: nothing to prove, no read-back
        start = part0.log_start_offset
        assert start is not None
        assert read_back_segment(config, store, 0, start, bytes(written)) is None
        # the object gone from the bucket: a clear error, not a crash
        written[-1] ^= 0xFF
        store.delete_many([m.segment_key(next(iter(mstore.iter_segments(m))))])
        gone = read_back_segment(config, store, 0, 0, bytes(written))
        assert gone is not None and gone.error is not None and not gone.ok
        assert read_back_line(gone).startswith(
            f"error: reading offsets 0..{bad.last_offset} of orders-0 back from the bucket "
            "failed: ")


@pytest.mark.slow  # two demo runs
def test_a_second_run_continues_and_archives_only_what_is_new(tmp_path: Path) -> None:
    base = tmp_path / "d"
    first = run_demo(base, echo=lambda line: None)
    before = _manifests(base)
    lines: list[str] = []
    second = run_demo(base, echo=lines.append)
    assert second.ok and second.continued
    assert lines[0].startswith("tiered demo continuing in ")
    after = _manifests(base)
    for partition in before:
        # the earlier objects are untouched; new ones follow them
        assert after[partition][: len(before[partition])] == before[partition]
        assert len(after[partition]) > len(before[partition])
    # the second run reads back the oldest segment the first run had left on local disk
    assert first.read_back is not None and second.read_back is not None
    local_start_after_first = next(r for r in first.rows if r["partition"] == 0)["local"]
    assert second.read_back.first_offset == local_start_after_first["start_offset"] > 0
    assert second.read_back.ok and second.read_back.source == "remote"
    assert any(line.startswith(f"read offsets {second.read_back.first_offset}..")
               for line in lines)
    uploaded = sum(p.uploaded_segments for p in second.report.partitions)
    assert uploaded == sum(len(after[p]) - len(before[p]) for p in before)
    assert {r["high_watermark"] for r in second.rows} == {
        2 * r["high_watermark"] for r in first.rows}


def test_written_config_loads_back_to_the_demo_settings(tmp_path: Path) -> None:
    config = demo_config(tmp_path)
    path = tmp_path / "tiered.toml"
    path.write_text(render_config_toml(config))
    tomllib.loads(path.read_text())  # plain TOML
    loaded = load_config(path)
    mine, theirs = config.effective(), loaded.effective()
    mine.pop("source"), theirs.pop("source")
    assert mine == theirs
    assert loaded.log_retention_mode == "enforce"
    assert loaded.cluster["retention_local_strict"] is True


@pytest.mark.slow  # a process
def test_the_demo_summary_is_not_buried_in_log_lines(tmp_path: Path) -> None:
    """On a terminal the demo's summary is its output: no INFO lines unless -v asks."""
    run = subprocess.run([sys.executable, "-m", "tiered.cli", "demo", "--dir",
                          str(tmp_path / "demo")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert " INFO " not in run.stderr, run.stderr[:2000]
    assert run.stdout.strip()
    verbose = subprocess.run([sys.executable, "-m", "tiered.cli", "-v", "demo", "--dir",
                              str(tmp_path / "demo")], capture_output=True, text=True,
                             timeout=300)
    assert verbose.returncode == 0 and " INFO " in verbose.stderr
