"""`tiered archive --once` and `tiered describe-storage` through the CLI: exit codes, JSON
shapes, a corrupt segment (design invariant 5 and 9), and refusal of configs without log dirs."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tiered.cli.main import cli
from tiered.config import load_config
from tiered.kafka.checkpoints import TopicPartition, new_topic_id
from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks
from tiered.kafka.segment import parse_segment_file_name

ROW_KEYS = {"topic", "partition", "high_watermark", "local", "remote", "pending_bytes",
            "safe_to_delete_below", "uploader", "role"}
LOCAL_KEYS = {"start_offset", "last_offset", "size_bytes", "segments"}
REMOTE_KEYS = {"start_offset", "last_offset", "size_bytes", "segments", "archived_manifests"}


def write_log(log_dir: Path, topic: str, partitions: int, batches: int,
              segment_bytes: int = 4096) -> dict[int, int]:
    """A log of `batches` 10-record batches per partition with small segments, high
    watermarks at the log ends; returns partition -> log end offset."""
    ends = {}
    topic_id = new_topic_id()  # one topic: every partition shares its id
    for p in range(partitions):
        with LogWriter(log_dir / f"{topic}-{p}", segment_bytes=segment_bytes, topic_id=topic_id,
                       fsync=False) as w:
            for b in range(batches):
                w.append([ProducerRecord(f"{topic}-{p}-{b}-{i}".encode() * 8)
                          for i in range(10)])
            ends[p] = w.log_end_offset
    write_high_watermarks(log_dir, {TopicPartition(topic, p): e for p, e in ends.items()},
                          fsync=False)
    return ends


def write_config(path: Path, url: str, log_dir: Path | None, extra: str = "") -> Path:
    text = f'[storage]\nurl = "{url}"\n'
    if log_dir is not None:
        text += f'[log]\ndirs = ["{log_dir}"]\n'
    path.write_text(text + extra)
    return path


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, ["-q", *args], catch_exceptions=False)


def closed_segments(part_dir: Path) -> list[Path]:
    logs = sorted(p for p in part_dir.iterdir() if parse_segment_file_name(p.name) is not None)
    return logs[:-1]  # the newest is the active segment


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    log_dir = tmp_path / "log"
    write_log(log_dir, "orders", 3, 40)
    config = write_config(tmp_path / "tiered.toml", (tmp_path / "bucket").as_uri(), log_dir)
    return config, log_dir


def _json(result: Result) -> Any:
    return json.loads(result.stdout)


def test_archive_once_uploads_every_closed_segment_and_exits_0(setup: tuple[Path, Path]) -> None:
    config, log_dir = setup
    expected = sum(len(closed_segments(log_dir / f"orders-{p}")) for p in range(3))
    assert expected >= 6
    uploaded = 0
    for _ in range(5):  # a pass may bound each partition's uploads; passes converge
        result = invoke("archive", "--once", "--config", str(config), "--json")
        assert result.exit_code == 0, result.output
        report = _json(result)
        assert report["ok"] is True and report["errors"] == []
        assert {(p["topic"], p["partition"]) for p in report["partitions"]} == {
            ("orders", 0), ("orders", 1), ("orders", 2)}
        if report["uploaded_segments"] == 0:
            break
        uploaded += report["uploaded_segments"]
    assert uploaded == expected


def test_archive_once_human_summary(setup: tuple[Path, Path]) -> None:
    config, _ = setup
    result = invoke("archive", "--once", "--config", str(config))
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0].startswith("3 partition(s): uploaded ")
    assert "retention: deleted 0 object(s)" in result.stdout


def test_a_corrupt_segment_fails_the_pass_but_not_the_other_partitions(
    setup: tuple[Path, Path]
) -> None:
    config, log_dir = setup
    victim = closed_segments(log_dir / "orders-1")[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a record: the batch CRC no longer matches
    victim.write_bytes(bytes(data))

    result = invoke("archive", "--once", "--config", str(config), "--json")
    assert result.exit_code == 1
    report = _json(result)
    assert report["ok"] is False
    rows = {p["partition"]: p for p in report["partitions"]}
    assert rows[1]["decision"] == "corrupt_segment"
    assert victim.name in rows[1]["error"]
    # the segment before the corrupt one went up; the corrupt one and later ones wait
    assert rows[1]["uploaded_segments"] == 1
    assert rows[0]["uploaded_segments"] > 0 and rows[0]["error"] is None
    assert rows[2]["uploaded_segments"] > 0 and rows[2]["error"] is None
    assert "orders-1: corrupt_segment:" in result.stderr


def test_archive_once_restores_the_gc_settings_it_tunes(setup: tuple[Path, Path]) -> None:
    # the pass raises the GC threshold and freezes start-up objects; a process that runs the
    # command in-process (tests, scripts) gets its own settings back, pass or failure
    config, _ = setup
    before = gc.get_threshold()
    assert invoke("archive", "--once", "--config", str(config)).exit_code == 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_archive_needs_once(setup: tuple[Path, Path]) -> None:
    config, _ = setup
    result = CliRunner().invoke(cli, ["archive", "--config", str(config)])
    assert result.exit_code == 2
    assert "add --once" in result.output


@pytest.mark.parametrize("command", [["archive", "--once"], ["describe-storage"], ["run"]])
def test_commands_refuse_a_config_without_log_dirs(tmp_path: Path, command: list[str]) -> None:
    config = write_config(tmp_path / "t.toml", (tmp_path / "bucket").as_uri(), None)
    result = CliRunner().invoke(cli, [*command, "--config", str(config)])
    assert result.exit_code == 2
    assert "[log] dirs is not set" in result.stderr


def test_archive_once_refuses_a_missing_log_dir(tmp_path: Path) -> None:
    config = write_config(tmp_path / "t.toml", (tmp_path / "bucket").as_uri(),
                          tmp_path / "typo")
    result = CliRunner().invoke(cli, ["archive", "--once", "--config", str(config)])
    assert result.exit_code == 2
    assert "typo does not exist or is not a directory" in result.stderr


def test_archive_once_against_an_unreachable_store_exits_with_the_store_code(
    tmp_path: Path
) -> None:
    log_dir = tmp_path / "log"
    write_log(log_dir, "orders", 1, 5)
    config = tmp_path / "t.toml"
    config.write_text(
        '[storage]\nurl = "s3://nowhere"\nendpoint_url = "http://127.0.0.1:9"\n'
        'access_key = "a"\nsecret_key = "b"\nregion = "us-east-1"\n'
        f'[log]\ndirs = ["{log_dir}"]\n'
        "[cluster]\ncloud_storage_initial_backoff_ms = 1\n"
    )
    result = CliRunner().invoke(cli, ["-q", "archive", "--once", "--config", str(config)])
    assert result.exit_code == 5, result.output
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.output


def test_archive_once_refuses_a_store_ignoring_conditions_and_writes_nothing(
    setup: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the probe runs beside the pass (ProbingStore); its verdict still decides the exit code,
    # and nothing (segment, index, manifest) appears in a store it refused
    from support.stores import IgnoresConditions

    from tiered.store import STORES

    monkeypatch.setitem(STORES, "file", IgnoresConditions)
    config, _ = setup
    result = CliRunner().invoke(cli, ["-q", "archive", "--once", "--config", str(config)])
    assert result.exit_code == 5, result.output
    assert "does not enforce conditional writes" in result.stderr
    assert "Traceback" not in result.output
    bucket = tmp_path / "bucket"
    assert not bucket.exists() or not [p for p in bucket.rglob("*") if p.is_file()
                                        and "/_tiered/" not in p.as_posix()
                                        and "/." not in p.as_posix()]


# --- describe-storage -----------------------------------------------------------------------


def test_describe_storage_json_field_names_and_values(setup: tuple[Path, Path]) -> None:
    config, log_dir = setup
    before = _json(invoke("describe-storage", "--config", str(config), "--json"))
    assert [r["partition"] for r in before] == [0, 1, 2]
    for row in before:
        assert set(row) == ROW_KEYS
        assert set(row["local"]) == LOCAL_KEYS
        assert set(row["remote"]) == REMOTE_KEYS
        assert row["remote"]["segments"] == 0 and row["remote"]["size_bytes"] == 0
        assert row["pending_bytes"] == row["local"]["size_bytes"]  # nothing uploaded yet
        assert row["safe_to_delete_below"] == row["local"]["start_offset"] == 0
        # nobody has taken the partition's upload lease yet
        assert row["uploader"] is None and row["role"] == "standby"

    for _ in range(5):
        if _json(invoke("archive", "--once", "--config", str(config), "--json"))[
                "uploaded_segments"] == 0:
            break
    after = _json(invoke("describe-storage", "--config", str(config), "--json"))
    for row in after:
        part_dir = log_dir / f"orders-{row['partition']}"
        closed = closed_segments(part_dir)
        local_bytes = sum(p.stat().st_size for p in part_dir.glob("*.log"))
        assert row["high_watermark"] == 400
        assert row["local"] == {"start_offset": 0, "last_offset": 399,
                                "size_bytes": local_bytes, "segments": len(closed) + 1}
        active_base = parse_segment_file_name(
            sorted(part_dir.glob("*.log"))[-1].name)
        assert active_base is not None
        assert row["remote"]["start_offset"] == 0
        assert row["remote"]["last_offset"] == active_base - 1
        assert row["remote"]["segments"] == len(closed)
        assert row["remote"]["size_bytes"] == sum(p.stat().st_size for p in closed)
        assert row["remote"]["archived_manifests"] == 0
        # only the active segment is left to upload; everything below it is safe to delete
        assert row["safe_to_delete_below"] == active_base
        assert row["pending_bytes"] == local_bytes - row["remote"]["size_bytes"]
        # archive --once took the lease for this node (named after the host by default)
        assert row["role"] == "uploader"
        assert row["uploader"] == load_config(config).node_id()


def test_describe_storage_topic_filter_and_human_table(tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    write_log(log_dir, "orders", 2, 10)
    write_log(log_dir, "audit.log", 1, 10)
    config = write_config(tmp_path / "t.toml", (tmp_path / "bucket").as_uri(), log_dir)

    rows = _json(invoke("describe-storage", "--config", str(config), "--topic", "audit.log",
                        "--json"))
    assert [(r["topic"], r["partition"]) for r in rows] == [("audit.log", 0)]

    result = invoke("describe-storage", "--config", str(config))
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split()[:2] == ["PARTITION", "HIGH"]
    assert [line.split()[0] for line in lines[1:4]] == ["audit.log-0", "orders-0", "orders-1"]
    assert lines[-1].startswith("3 partitions: ")

    # a topic nobody holds is unknown, not an empty table (exit 7)
    unknown = CliRunner().invoke(cli, ["-q", "describe-storage", "--config", str(config),
                                       "--topic", "nope", "--json"])
    assert unknown.exit_code == 7 and unknown.stdout == ""


def test_describe_storage_rejects_a_hostile_topic_name(setup: tuple[Path, Path]) -> None:
    config, _ = setup
    result = CliRunner().invoke(cli, ["describe-storage", "--config", str(config),
                                      "--topic", "../x"])
    assert result.exit_code == 2
    assert "--topic" in result.output and "'/'" in result.output


def test_describe_storage_reads_only(setup: tuple[Path, Path], tmp_path: Path) -> None:
    config, _ = setup
    assert invoke("describe-storage", "--config", str(config)).exit_code == 0
    bucket = tmp_path / "bucket"
    assert not bucket.exists() or not any(p.is_file() for p in bucket.rglob("*"))


def test_render_rows_handles_empty_sides_and_manifest_errors() -> None:
    from tiered.app.describe import render_rows, summary_line

    rows: list[dict[str, Any]] = [
        {"topic": "t", "partition": 0, "high_watermark": None,
         "local": {"start_offset": None, "last_offset": None, "size_bytes": 0, "segments": 0},
         "remote": {"start_offset": None, "last_offset": None, "size_bytes": 0, "segments": 0,
                    "archived_manifests": 0},
         "pending_bytes": 0, "safe_to_delete_below": None},
        {"topic": "t", "partition": 1, "high_watermark": 2000,
         "local": {"start_offset": 1000, "last_offset": 1999, "size_bytes": 4096,
                   "segments": 2},
         "remote": {"start_offset": 0, "last_offset": 1499, "size_bytes": 3 * 1024 * 1024,
                    "segments": 9, "archived_manifests": 1},
         "pending_bytes": 1024, "safe_to_delete_below": 1500, "uploader": "broker-2",
         "role": "standby"},
        {"topic": "t", "partition": 2, "high_watermark": 10,
         "local": {"start_offset": 0, "last_offset": 9, "size_bytes": 100, "segments": 1},
         "remote": {"start_offset": None, "last_offset": None, "size_bytes": 0, "segments": 0,
                    "archived_manifests": 0, "error": "CorruptManifest: bad JSON"},
         "pending_bytes": 100, "safe_to_delete_below": 0},
    ]
    lines = render_rows(rows)
    header, empty, full, failed, error = lines
    assert header.split()[0] == "PARTITION"
    # a row without the newer fields (an older JSON dump) renders them as "-"
    assert empty.split() == ["t-0", "-", "-", "-", "-", "-", "0", "B", "-", "-", "-"]
    assert "1000..1999" in full and "0..1499" in full
    assert "3 MiB in 9 seg (+1 archived manifest)" in full
    assert full.split()[-3:] == ["1500", "broker-2", "standby"]
    assert "error (below)" in failed
    assert error == "t-2: cannot read the manifest: CorruptManifest: bad JSON"
    # columns line up: every row is as wide as the header up to the last column
    assert all(len(line) <= len(header) + 10 for line in (empty, full, failed))
    assert summary_line(rows) == ("3 partitions: 4.1 KiB local, 3 MiB in the bucket, "
                                  "1.1 KiB waiting for upload")
    assert render_rows([]) == ["no partitions found"]


def _s3_config(tmp_path: Path, endpoint: str, bucket: str, log_dir: Path) -> Path:
    return write_config(
        tmp_path / "s3.toml", f"s3://{bucket}/pfx", None,
        f'endpoint_url = "{endpoint}"\nregion = "us-east-1"\naccess_key = "testing"\n'
        f'secret_key = "testing"\n[log]\ndirs = ["{log_dir}"]\n'
        "[cluster]\ncloud_storage_initial_backoff_ms = 1\n")


def test_describe_storage_says_the_bucket_does_not_exist_once(
    tmp_path: Path, moto_endpoint: str
) -> None:
    log_dir = tmp_path / "log"
    write_log(log_dir, "orders", partitions=3, batches=5)
    config = _s3_config(tmp_path, moto_endpoint, "no-such-bucket-here", log_dir)
    result = CliRunner().invoke(cli, ["-q", "describe-storage", "--config", str(config)])
    assert result.exit_code == 5, result.output
    assert result.stderr.count("error:") == 1 and "the bucket does not exist" in result.stderr
    assert "0 B" not in result.stdout


def test_describe_storage_on_a_closed_port_is_one_quick_diagnosis(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_dir = tmp_path / "log"
    write_log(log_dir, "orders", partitions=3, batches=5)
    config = _s3_config(tmp_path, f"http://127.0.0.1:{port}", "bucket-x", log_dir)
    result = CliRunner().invoke(cli, ["describe-storage", "--config", str(config)])
    assert result.exit_code == 5
    assert result.stderr.count("error:") == 1, result.stderr
    # one request, retried once: not one diagnosis (and six attempts) per partition
    assert result.stderr.count("attempt ") <= 1, result.stderr


def test_describe_storage_exits_1_when_a_partition_cannot_be_read(
    setup: tuple[Path, Path]
) -> None:
    config, log_dir = setup
    assert invoke("archive", "--once", "--config", str(config)).exit_code == 0
    from tiered.store import FileStore, StoreSettings

    store = FileStore(StoreSettings(url=(log_dir.parent / "bucket").as_uri()))
    head = next(i.key for i in store.list("") if i.key.endswith("/manifest.json"))
    store.put(head, b"{ not json")
    result = CliRunner().invoke(cli, ["-q", "describe-storage", "--config", str(config)])
    assert result.exit_code == 1
    assert "cannot read the manifest" in result.stdout


def test_describe_storage_shows_how_the_probe_found_conditional_writes(
    setup: tuple[Path, Path]
) -> None:
    config, _ = setup
    before = invoke("describe-storage", "--config", str(config))
    assert "conditional writes: not probed yet" in before.stdout
    assert invoke("archive", "--once", "--config", str(config)).exit_code == 0
    after = invoke("describe-storage", "--config", str(config))
    assert "conditional writes: enforced (If-Match sent native)" in after.stdout


def test_bucket_create_makes_the_bucket_archive_then_uses(tmp_path: Path,
                                                          moto_endpoint: str) -> None:
    """A user without the compose stack creates the bucket with one command; a second run
    says it is there and still exits 0."""
    import uuid

    log_dir = tmp_path / "log"
    write_log(log_dir, "orders", partitions=1, batches=5)
    bucket = f"made-by-tiered-{uuid.uuid4().hex[:12]}"
    config = _s3_config(tmp_path, moto_endpoint, bucket, log_dir)
    before = CliRunner().invoke(cli, ["-q", "archive", "--once", "--config", str(config)])
    assert before.exit_code != 0 and "bucket does not exist" in before.stderr
    made = CliRunner().invoke(cli, ["bucket", "create", "--config", str(config), "--json"])
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout) == {"url": f"s3://{bucket}/pfx", "created": True}
    again = CliRunner().invoke(cli, ["bucket", "create", "--config", str(config)])
    assert again.exit_code == 0 and "already exists" in again.stdout
    after = CliRunner().invoke(cli, ["-q", "archive", "--once", "--config", str(config)])
    assert after.exit_code == 0, after.output


def test_bucket_create_for_a_directory_bucket(tmp_path: Path) -> None:
    config = write_config(tmp_path / "f.toml", (tmp_path / "bucket").as_uri(), tmp_path)
    made = CliRunner().invoke(cli, ["bucket", "create", "--config", str(config)])
    assert made.exit_code == 0 and "created the bucket" in made.stdout
    assert (tmp_path / "bucket").is_dir()
    again = CliRunner().invoke(cli, ["bucket", "create", "--config", str(config)])
    assert again.exit_code == 0 and "already exists" in again.stdout


def test_describe_storage_describes_the_bucket_on_a_history_server_config(
        setup: tuple[Path, Path], tmp_path: Path) -> None:
    """`[log] dirs = []` (a history server) has no log, but a bucket to describe; a topic only
    the bucket holds is described from it; a topic nobody holds is an error, not an empty
    table."""
    config, _log_dir = setup
    invoke("archive", "--once", "--config", str(config))
    archived = {r["partition"]: r["remote"]
                for r in _json(invoke("describe-storage", "--config", str(config), "--json"))}
    url = load_config(config).storage.url
    history = write_config(tmp_path / "history.toml", url, None,
                           '[log]\ndirs = []\n[node]\nid = "history-1"\n')
    rows = _json(invoke("describe-storage", "--config", str(history), "--json"))
    assert [(r["topic"], r["partition"]) for r in rows] == [("orders", 0), ("orders", 1),
                                                             ("orders", 2)]
    for row in rows:
        assert set(row) == ROW_KEYS and set(row["remote"]) == REMOTE_KEYS
        assert row["remote"] == archived[row["partition"]] and row["remote"]["segments"] > 0
        assert row["local"]["segments"] == 0 and row["pending_bytes"] == 0
        assert row["uploader"] == load_config(config).node_id() and row["role"] == "standby"
    table = CliRunner().invoke(cli, ["-q", "describe-storage", "--config", str(history)])
    assert table.exit_code == 0 and "orders-2" in table.stdout

    elsewhere = tmp_path / "other-log"
    elsewhere.mkdir()
    other = write_config(tmp_path / "other.toml", url, elsewhere)
    only_bucket = _json(invoke("describe-storage", "--config", str(other), "--topic", "orders",
                               "--json"))
    assert [r["remote"] for r in only_bucket] == [archived[p] for p in (0, 1, 2)]
    for cfg in (config, history, other):
        unknown = CliRunner().invoke(cli, ["-q", "describe-storage", "--config", str(cfg),
                                           "--topic", "nosuch"])
        assert unknown.exit_code == 7, unknown.output
        assert "unknown topic 'nosuch'" in unknown.stderr
