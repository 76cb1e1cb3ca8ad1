"""`tiered merge` / `recover` / `scrub` on the command line: JSON fields, exit codes, and the
install hint when PySpark is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from support.spark import REVISION, TOPIC, make_context, seed

from tiered.cli.main import cli
from tiered.store.base import ObjectStore

ROOT = Path(__file__).resolve().parents[2]


def write_config(path: Path, store: ObjectStore, extra: str = "") -> Path:
    path.write_text(
        f'[storage]\nurl = "{store.settings.url}"\n\n[cluster]\n'
        "cloud_storage_segment_size_target = 8192\ncloud_storage_segment_size_min = 4096\n"
        + extra
    )
    return path


@pytest.mark.spark
def test_merge_json_reports_what_it_did(file_store: ObjectStore, spark: Any,
                                        tmp_path: Path) -> None:
    ctx = make_context(file_store)
    seed(ctx.manifests, partitions=2, segments=12)
    config = write_config(tmp_path / "tiered.toml", file_store)

    result = CliRunner().invoke(cli, ["merge", "--config", str(config), "--json"])

    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)  # progress went to stderr, stdout is pure JSON
    assert summary["ok"] is True and summary["disabled"] is False
    assert summary["partitions_scanned"] == 2
    assert summary["before"]["segments"] == 24
    assert 0 < summary["after"]["segments"] < 24
    assert summary["before"]["bytes"] == summary["after"]["bytes"]
    assert summary["runs_committed"] >= 2
    assert summary["segments_merged"] > summary["runs_committed"]
    assert summary["bytes_uploaded"] >= summary["bytes_read"] > 0
    for key in ("skipped", "errors", "partitions", "elapsed_s", "commit_conflicts"):
        assert key in summary
    assert {(p["topic"], p["partition"], p["revision"]) for p in summary["partitions"]} == {
        (TOPIC, 0, REVISION), (TOPIC, 1, REVISION)}
    assert summary["errors"] == []
    assert "merge:" in result.stderr and "tasks" in result.stderr


@pytest.mark.spark
def test_merge_human_output_and_topic_filter(file_store: ObjectStore, spark: Any,
                                             tmp_path: Path) -> None:
    seed(make_context(file_store).manifests, partitions=1, segments=12)
    config = write_config(tmp_path / "tiered.toml", file_store)
    other = CliRunner().invoke(cli, ["merge", "--config", str(config), "--topic", "nope"])
    # a typo is not "nothing to do": the topic is unknown, said once, non-zero
    assert other.exit_code == 7, other.output
    assert "unknown topic 'nope'" in other.stderr and "Traceback" not in other.output
    for job in (["scrub"], ["recover", "--log-dir", str(tmp_path / "out")]):
        other = CliRunner().invoke(cli, [*job, "--config", str(config), "--topic", "nope"])
        assert other.exit_code == 7, (job, other.output)
        assert "unknown topic 'nope'" in other.stderr and "Traceback" not in other.output
    result = CliRunner().invoke(cli, ["merge", "--config", str(config), "--topic", TOPIC])
    assert result.exit_code == 0, result.output
    assert "segments: 12 -> " in result.stdout
    assert f"{TOPIC}/0: 12 -> " in result.stdout


def test_merge_disabled_by_config_does_nothing(
    file_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path / "tiered.toml", file_store,
                          "cloud_storage_enable_segment_merging = false\n")
    monkeypatch.setitem(sys.modules, "pyspark", None)  # switched off: Spark is not even needed
    result = CliRunner().invoke(cli, ["merge", "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["disabled"] is True and summary["ok"] is True
    assert "--force" in summary["message"]


@pytest.mark.parametrize("command", [["merge"], ["scrub"], ["recover", "--rebuild-manifests"]])
def test_missing_pyspark_says_how_to_install_the_extra(
    command: list[str], file_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", None)  # makes `import pyspark` fail
    config = write_config(tmp_path / "tiered.toml", file_store)
    result = CliRunner().invoke(cli, [*command, "--config", str(config)])
    assert result.exit_code == 2
    assert "pip install 'tiered[spark]'" in result.stderr
    assert "Traceback" not in result.output


def test_recover_needs_a_topic_and_log_dir(file_store: ObjectStore, tmp_path: Path) -> None:
    config = write_config(tmp_path / "tiered.toml", file_store)
    result = CliRunner().invoke(cli, ["recover", "--config", str(config), "--topic", TOPIC])
    assert result.exit_code == 2
    assert "--log-dir" in result.output
    both = CliRunner().invoke(cli, ["recover", "--config", str(config), "--rebuild-manifests",
                                    "--log-dir", str(tmp_path)])
    assert both.exit_code == 2
    overwrite = CliRunner().invoke(cli, ["recover", "--config", str(config),
                                         "--rebuild-manifests", "--overwrite"])
    assert overwrite.exit_code == 2 and "--overwrite" in overwrite.output


def test_bad_max_bytes_is_a_usage_error(file_store: ObjectStore, tmp_path: Path) -> None:
    config = write_config(tmp_path / "tiered.toml", file_store)
    result = CliRunner().invoke(cli, ["recover", "--config", str(config), "--topic", TOPIC,
                                      "--log-dir", str(tmp_path / "log"), "--max-bytes", "12M"])
    assert result.exit_code == 2
    assert "ambiguous" in result.output


def test_cli_import_does_not_load_pyspark_and_submit_py_runs_each_job() -> None:
    probe = subprocess.run(
        [sys.executable, "-c",
         "import sys, tiered.cli.main, spark_jobs.merge; print('pyspark' in sys.modules)"],
        capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, check=True)
    assert probe.stdout.strip() == "False"
    # spark-submit spark_jobs/submit.py JOB runs the file as a script with JOB's arguments
    for job in ("merge", "recover", "scrub"):
        script = subprocess.run(
            [sys.executable, str(ROOT / "spark_jobs" / "submit.py"), job, "--help"],
            capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, check=True)
        assert "--config" in script.stdout and "--master" in script.stdout, job
    bad = subprocess.run([sys.executable, str(ROOT / "spark_jobs" / "submit.py"), "nope"],
                         capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT)})
    assert bad.returncode == 2 and "merge|recover|scrub" in bad.stderr


@pytest.mark.spark
def test_force_merges_even_when_disabled(file_store: ObjectStore, spark: Any,
                                         tmp_path: Path) -> None:
    seed(make_context(file_store).manifests, partitions=1, segments=12)
    config = write_config(tmp_path / "tiered.toml", file_store,
                          "cloud_storage_enable_segment_merging = false\n")
    result = CliRunner().invoke(cli, ["merge", "--config", str(config), "--force", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["disabled"] is False and summary["runs_committed"] >= 1
