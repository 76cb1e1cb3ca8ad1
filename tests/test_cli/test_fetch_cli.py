"""`tiered fetch`: raw record-batch bytes and jsonl records from the bucket once the local log
is gone, and a clear message with a non-zero exit for out-of-range offsets, unknown
partitions and bad arguments (design invariant 9)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from support.processes import child_env, tiered_command
from support.remote import TOPIC, LogImage, record_timestamp, template

from manifests import keys
from tiered.cli.main import cli
from tiered.kafka.records import iter_batches
from tiered.store import FileStore, StoreSettings


@pytest.fixture
def remote_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LogImage, int]:
    return template(tmp_path_factory)


@pytest.fixture
def config_file(tmp_path: Path, remote_template: tuple[Path, LogImage, int]) -> Path:
    base, _image, _end = remote_template
    path = tmp_path / "tiered.toml"
    path.write_text(
        "[storage]\n"
        f"url = \"{(base / 'bucket').as_uri()}\"\n"
        "[log]\n"
        f"dirs = [\"{tmp_path / 'logs'}\"]\n"
        "[cache]\n"
        f"dir = \"{tmp_path / 'cache'}\"\n"
        "[cluster]\n"
        "cloud_storage_cache_chunk_size = 1024\n"
    )
    (tmp_path / "logs").mkdir()
    return path


def fetch(config: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["-q", "fetch", "--config", str(config), "--topic", TOPIC,
                                    *args])


def test_raw_writes_the_record_batches(config_file: Path,
                                       remote_template: tuple[Path, LogImage, int]) -> None:
    _base, image, _end = remote_template
    result = fetch(config_file, "--partition", "0", "--offset", "31", "--max-bytes", "1500",
                   "--format", "raw")
    assert result.exit_code == 0, result.stderr
    assert result.stdout_bytes == image.expected(31, 1500)


def test_jsonl_prints_one_record_a_line(config_file: Path,
                                        remote_template: tuple[Path, LogImage, int]) -> None:
    _base, image, _end = remote_template
    result = fetch(config_file, "--partition", "0", "--offset", "40", "--max-bytes", "3000")
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    want = [r for b in iter_batches(image.expected(40, 3000)) for r in b.records
            if r.offset >= 40]
    assert len(lines) == len(want) > 5
    for line, record in zip(lines, want, strict=True):
        assert set(line) == {"offset", "timestamp", "key", "value", "headers"}
        assert line["offset"] == record.offset
        assert line["timestamp"] == record_timestamp(record.offset)
        assert line["key"] == (None if record.key is None
                               else base64.b64encode(record.key).decode())
        assert line["value"] == (None if record.value is None
                                 else base64.b64encode(record.value).decode())
        assert [h["key"] for h in line["headers"]] == [h.key for h in record.headers]
    assert any(line["key"] is None for line in lines)
    assert any(line["headers"] for line in lines)


def test_out_of_range_exits_4_with_the_bounds(config_file: Path,
                                              remote_template: tuple[Path, LogImage, int]) -> None:
    _base, _image, end = remote_template
    result = fetch(config_file, "--partition", "0", "--offset", str(end + 10))
    assert result.exit_code == 4
    assert result.stdout == ""
    assert f"offset {end + 10}" in result.stderr and f"0..{end - 1}" in result.stderr


def test_unknown_partition_and_bad_topic_fail_clearly(config_file: Path) -> None:
    result = fetch(config_file, "--partition", "7", "--offset", "0")
    assert result.exit_code == 7
    assert "partitions" in result.stderr
    result = CliRunner().invoke(cli, ["-q", "fetch", "--config", str(config_file), "--topic",
                                      "../etc", "--partition", "0", "--offset", "0"])
    assert result.exit_code == 2
    assert "error:" in result.stderr and "Traceback" not in result.output
    result = fetch(config_file, "--partition", "0", "--offset", "-1")
    assert result.exit_code == 2


def test_a_missing_object_costs_only_its_offsets(
    tmp_path: Path, remote_template: tuple[Path, LogImage, int]
) -> None:
    """A fetch spanning a missing object serves the batches before it (exit 0); a fetch
    starting in it fails with exit 6 naming the object; the offsets after it still read."""
    base, image, _end = remote_template
    bucket = tmp_path / "bucket"
    shutil.copytree(base / "bucket", bucket)
    config = tmp_path / "tiered.toml"
    config.write_text(f'[storage]\nurl = "{bucket.as_uri()}"\n[log]\ndirs = ["{tmp_path / "logs"}"]'
                      f'\n[cache]\ndir = "{tmp_path / "cache"}"\n')
    (tmp_path / "logs").mkdir()
    store = FileStore(StoreSettings(url=bucket.as_uri()))
    objects = sorted((keys.parse_segment_name(i.key.rsplit("/", 1)[1]), i.key)
                     for i in store.list("") if i.key.endswith(".log"))
    victim, key = objects[2]
    assert victim is not None
    store.delete_many([key])
    served = fetch(config, "--partition", "0", "--offset", "0", "--max-bytes", str(10**9),
                   "--format", "raw")
    assert served.exit_code == 0, served.stderr
    assert served.stdout_bytes == b"".join(d for b, _, d in image.batches
                                           if b < victim.base_offset)
    failed = fetch(config, "--partition", "0", "--offset", str(victim.base_offset))
    assert failed.exit_code == 6 and key.rsplit("/", 1)[1] in failed.stderr
    after = fetch(config, "--partition", "0", "--offset", str(victim.last_offset + 1),
                  "--max-bytes", "0", "--format", "raw")
    assert after.exit_code == 0 and after.stdout_bytes == image.expected(victim.last_offset + 1, 0)


def test_a_cache_dir_that_cannot_be_created_is_a_clear_error(tmp_path: Path,
                                                             config_file: Path) -> None:
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("x")
    text = config_file.read_text().replace(f'dir = "{tmp_path / "cache"}"',
                                           f'dir = "{in_the_way / "cache"}"')
    config_file.write_text(text)
    result = fetch(config_file, "--partition", "0", "--offset", "0")
    assert result.exit_code == 6, result.output
    assert "cache directory" in result.stderr and "Traceback" not in result.output


def test_fetch_from_a_bucket_that_does_not_exist_says_so(tmp_path: Path,
                                                         moto_endpoint: str) -> None:
    config = tmp_path / "tiered.toml"
    config.write_text(
        '[storage]\nurl = "s3://no-such-bucket-here/x"\n'
        f'endpoint_url = "{moto_endpoint}"\nregion = "us-east-1"\n'
        'access_key = "testing"\nsecret_key = "testing"\n'
        f'[log]\ndirs = ["{tmp_path / "logs"}"]\n[cache]\ndir = "{tmp_path / "cache"}"\n'
        "[cluster]\ncloud_storage_initial_backoff_ms = 1\n")
    (tmp_path / "logs").mkdir()
    result = fetch(config, "--partition", "0", "--offset", "0")
    assert result.exit_code != 0 and "bucket does not exist" in result.stderr, result.stderr


@pytest.mark.slow  # processes
def test_several_fetch_processes_share_one_cache_directory(
        config_file: Path, remote_template: tuple[Path, LogImage, int]) -> None:
    """`tiered fetch` runs at once on one `[cache] dir`: each walks, trims and writes it while
    the others do; every one answers with the right bytes."""
    _base, image, end = remote_template
    jobs = []
    for n in range(6):
        offset = (n * 37) % end
        argv = tiered_command("-q", "fetch", "--config", str(config_file), "--topic", TOPIC,
                              "--partition", "0", "--offset", str(offset), "--max-bytes",
                              "4000", "--format", "raw")
        jobs.append((offset, subprocess.Popen(argv, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, env=child_env())))
    for offset, proc in jobs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-2000:]
        assert out == image.expected(offset, 4000)


def test_past_the_end_names_the_buckets_range_too(tmp_path: Path,
                                                  file_store: FileStore) -> None:
    """The local log starts late, the bucket holds 0..: the CLI names the whole readable
    range, as the HTTP API's 416 does, instead of "older offsets may be in the bucket"."""
    from support.remote import archived_partition, drop_local_segments

    fx = archived_partition(tmp_path, file_store, batches=120)
    drop_local_segments(fx.config, below=fx.end // 2)
    config = tmp_path / "tiered.toml"
    config.write_text(
        f"[storage]\nurl = \"{(tmp_path / 'bucket').as_uri()}\"\n"
        f"[log]\ndirs = [\"{fx.config.log_dirs[0]}\"]\n"
        f"[cache]\ndir = \"{tmp_path / 'cache'}\"\n")
    result = fetch(config, "--partition", "0", "--offset", str(fx.end + 5))
    assert result.exit_code == 4
    assert "may be in the bucket" not in result.stderr
    assert f"readable offsets 0..{fx.end - 1}" in result.stderr, result.stderr


def test_fetch_by_timestamp_in_the_bucket_and_the_local_log(tmp_path: Path,
                                                            file_store: FileStore) -> None:
    """`--timestamp` (ms or ISO-8601) starts at the first record at or after it, wherever
    that record lives; past the end says so (exit 4); with --offset it is a usage error."""
    from support.remote import archived_partition, drop_local_segments

    from tiered.config.units import format_timestamp_ms

    fx = archived_partition(tmp_path, file_store, batches=120)
    drop_local_segments(fx.config, below=fx.end // 2)
    config = tmp_path / "tiered.toml"
    config.write_text(
        f"[storage]\nurl = \"{(tmp_path / 'bucket').as_uri()}\"\n"
        f"[log]\ndirs = [\"{fx.config.log_dirs[0]}\"]\n"
        f"[cache]\ndir = \"{tmp_path / 'cache'}\"\n")
    for offset in (3, fx.end - 2):  # in the bucket only, then in the local log
        for when in (str(record_timestamp(offset)), format_timestamp_ms(record_timestamp(offset))):
            result = fetch(config, "--partition", "0", "--timestamp", when, "--max-bytes", "1")
            assert result.exit_code == 0, result.stderr
            first = json.loads(result.stdout.splitlines()[0])
            assert first["offset"] == offset and first["timestamp"] == record_timestamp(offset)
    late = fetch(config, "--partition", "0", "--timestamp", str(record_timestamp(fx.end) + 1))
    assert late.exit_code == 4 and "every record is older" in late.stderr
    assert f"the log end is {fx.end}" in late.stderr
    both = fetch(config, "--partition", "0", "--timestamp", "5", "--offset", "5")
    assert both.exit_code == 2 and "exactly one of --offset and --timestamp" in both.stderr
    naive = fetch(config, "--partition", "0", "--timestamp", "2026-11-01T00:00:00")
    assert naive.exit_code == 2 and "no time zone" in naive.stderr


def test_a_corrupt_batch_mid_object_costs_only_itself(
    tmp_path: Path, remote_template: tuple[Path, LogImage, int]
) -> None:
    """A damaged batch in the middle of a segment object (and of its chunk): a fetch reaching
    it prints the batches before it (exit 0); one starting at it exits 3 naming the object key
    and byte (docs/remote-read.md, "Corrupt data")."""
    from tiered.kafka.records import iter_batch_headers

    base, image, _end = remote_template
    bucket = tmp_path / "bucket"
    shutil.copytree(base / "bucket", bucket)
    config = tmp_path / "tiered.toml"
    config.write_text(f'[storage]\nurl = "{bucket.as_uri()}"\n[log]\ndirs = ["{tmp_path / "logs"}"]'
                      f'\n[cache]\ndir = "{tmp_path / "cache"}"\n')
    (tmp_path / "logs").mkdir()
    store = FileStore(StoreSettings(url=bucket.as_uri()))
    objects = sorted((keys.parse_segment_name(i.key.rsplit("/", 1)[1]), i.key)
                     for i in store.list("") if i.key.endswith(".log"))
    key = objects[len(objects) // 2][1]
    data = bytearray((bucket / key).read_bytes())
    headers = list(iter_batch_headers(bytes(data)))
    victim = headers[len(headers) // 2]
    assert victim.position > 0
    data[victim.position + 70] ^= 0xFF
    (bucket / key).write_bytes(bytes(data))
    served = fetch(config, "--partition", "0", "--offset", "0", "--max-bytes", str(10**9),
                   "--format", "raw")
    assert served.exit_code == 0, served.stderr
    assert served.stdout_bytes == b"".join(d for b, _, d in image.batches
                                           if b < victim.base_offset)
    failed = fetch(config, "--partition", "0", "--offset", str(victim.base_offset))
    assert failed.exit_code == 3
    assert f"{key}, byte {victim.position}" in failed.stderr
