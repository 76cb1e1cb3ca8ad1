"""`tiered demo`: runs in a temporary directory, archives into its `file://` bucket (manifests
committed, objects as the local files), trims local retention, and continues on a second run."""

from __future__ import annotations

import tomllib
from pathlib import Path

import crc32c
import pytest
from click.testing import CliRunner

from archiver.service import revision_of
from manifests import ManifestSettings, ManifestStore
from tiered.cli import cli
from tiered.config import load_config
from tiered.demo import DEMO_PARTITIONS, DEMO_TOPIC, demo_config, render_config_toml, run_demo
from tiered.local_log import LocalLog
from tiered.store import open_store


def _manifests(base: Path) -> dict[int, list[tuple[int, int, int, int]]]:
    """partition -> [(base, last, size, checksum)] of every segment its manifest names, each
    checked against the object's bytes in the bucket (invariant 1)."""
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

    manifests = _manifests(base)
    assert sorted(manifests) == list(range(DEMO_PARTITIONS))
    for partition, segments in manifests.items():
        assert segments, f"partition {partition} has nothing in the bucket"
        # contiguous from offset 0
        assert segments[0][0] == 0
        for (_, last, _, _), (nxt, _, _, _) in zip(segments, segments[1:], strict=False):
            assert nxt == last + 1


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
