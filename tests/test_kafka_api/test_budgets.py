"""Fetch answers have a broker's budgets, whatever a client asks (docs/kafka-api.md, "Limits
and security"): a partition named many times is answered once, one answer's records stay
within `[kafka] fetch_max_bytes`, one request reads at most `max_partitions_per_fetch`
partitions (the rest get their turn in the next requests) and holds a bounded number of chunk
files. Under the 2,000-duplicate attack a real `tiered run` process keeps its open files and
memory bounded and its /health ok. And a corrupt batch stops a fetch just before it, over the
Kafka protocol and the HTTP records API alike."""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import re
import socket
import struct
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
from support.daemons import running
from support.kafka_endpoint import (
    TOPIC,
    History,
    RawClient,
    build_history,
    request_class,
)
from support.processes import child_env, tiered_command
from support.waiting import wait_until

from tiered.app.daemon import Daemon
from tiered.app.kafka_api.messages import build, nested
from tiered.kafka.records import iter_batch_headers

pytestmark = pytest.mark.timeout(300)

FETCH = 1
INT32_MAX = 2**31 - 1
MiB = 1 << 20


def _fetch_request(version: int, topics: list[tuple[Any, list[tuple[int, int, int]]]], *,
                   max_bytes: int = INT32_MAX) -> Any:
    """A Fetch of (topic name or id, [(partition, offset, partition_max_bytes)]) entries, in
    that order, duplicates and all."""
    cls = request_class(FETCH, version)
    part_cls, topic_cls = nested(cls, "FetchPartition"), nested(cls, "FetchTopic")
    entries = []
    for topic, parts in topics:
        ident = {"topic_id": topic} if version >= 13 else {"topic": topic}
        entries.append(build(topic_cls, partitions=tuple(
            build(part_cls, partition=p, fetch_offset=o, partition_max_bytes=m,
                  current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)
            for p, o, m in parts), **ident))
    replica_state = build(nested(cls, "ReplicaState"), replica_id=-1,
                          replica_epoch=-1) if version >= 15 else None
    return build(cls, replica_id=-1, replica_state=replica_state,
                 max_wait=datetime.timedelta(0), min_bytes=0, max_bytes=max_bytes,
                 isolation_level=0, session_id=0, session_epoch=-1, topics=tuple(entries),
                 forgotten_topics_data=(), rack_id="")


def _answers(got: Any) -> list[tuple[Any, int, Any]]:
    """(topic, partition, partition data) of an answer, in order."""
    return [(getattr(t, "topic", None) or t.topic_id, p.partition_index, p)
            for t in got.responses for p in t.partitions]


def _archived(history: History, partition: int) -> bytes:
    """Every batch of the partition the bucket holds."""
    end = history.archived_end[(TOPIC, partition)]
    return b"".join(d for base, _, d in history.batches[(TOPIC, partition)] if base < end)


@pytest.fixture
def client(daemon: Daemon) -> Iterator[RawClient]:
    assert daemon.kafka is not None
    c = RawClient(daemon.kafka.port)
    yield c
    c.close()


# --- duplicates, the byte cap, the partition bound ---------------------------------------------


@pytest.mark.parametrize("version", [12, 16])
def test_a_partition_named_many_times_is_answered_once(history: History, client: RawClient,
                                                       version: int) -> None:
    """As a broker: one entry per distinct partition, where it was first named, with the fetch
    offset and byte limit it was last named with."""
    topic: Any = TOPIC
    if version >= 13:
        cls = request_class(3, 12)
        meta = client.request(build(cls, topics=(build(
            nested(cls, "MetadataRequestTopic"), name=TOPIC, topic_id=None),)))
        topic = meta.topics[0].topic_id
    got = client.request(_fetch_request(version, [
        (topic, [(0, 0, 100), (1, 0, 3000), (0, 3, 100)]),
        (topic, [(0, 5, 2000)] * 50),
    ]))
    answers = _answers(got)
    assert [(t, p) for t, p, _ in answers] == [(topic, 0), (topic, 1)]
    (_, _, zero), (_, _, one) = answers
    assert zero.records == history.expected_bytes(TOPIC, 0, 5, 2000)
    assert one.records == history.expected_bytes(TOPIC, 1, 0, 3000)


def test_one_answer_is_capped_by_fetch_max_bytes(history: History) -> None:
    """`[kafka] fetch_max_bytes` caps the answer whatever the request's max_bytes; the first
    batch of the first partition with data still comes (KIP-74)."""
    cap = 3000
    with running(history.config(kafka={"fetch_max_bytes": cap})) as daemon:
        assert daemon.kafka is not None
        client = RawClient(daemon.kafka.port)
        try:
            got = client.request(_fetch_request(12, [
                (TOPIC, [(0, 0, INT32_MAX), (1, 0, INT32_MAX)])]))
            (_, _, zero), (_, _, one) = _answers(got)
            assert zero.records == history.expected_bytes(TOPIC, 0, 0, cap)
            assert one.records == history.expected_bytes(TOPIC, 1, 0, cap - len(zero.records),
                                                         first=False)
            assert len(zero.records) + len(one.records) <= cap
            # a smaller request max_bytes still rules
            small = client.request(_fetch_request(12, [(TOPIC, [(0, 0, INT32_MAX)])],
                                                  max_bytes=1000))
            assert _answers(small)[0][2].records == history.expected_bytes(TOPIC, 0, 0, 1000)
            # KIP-74: a first batch larger than the cap comes whole
            big = max(history.batches[(TOPIC, 0)], key=lambda b: len(b[2]))
            with running(history.config(kafka={"fetch_max_bytes": len(big[2]) - 1},
                                        cache="cache-tiny")) as tiny:
                assert tiny.kafka is not None
                other = RawClient(tiny.kafka.port)
                try:
                    one_batch = other.request(_fetch_request(12, [(TOPIC, [(0, big[0], 10**6)])]))
                finally:
                    other.close()
            assert _answers(one_batch)[0][2].records == big[2]
        finally:
            client.close()


def test_partitions_past_the_bound_wait_for_the_next_request(history: History) -> None:
    """`[kafka] max_partitions_per_fetch`: the partitions past it get no data and unknown
    offsets this time, and the connection's next request reads them first."""
    with running(history.config(kafka={"max_partitions_per_fetch": 1})) as daemon:
        assert daemon.kafka is not None
        client = RawClient(daemon.kafka.port)
        try:
            asked = [(TOPIC, [(0, 0, 1000), (1, 0, 1000)])]
            rounds = [_answers(client.request(_fetch_request(12, asked))) for _ in range(3)]
        finally:
            client.close()
    for served, answers in zip((0, 1, 0), rounds, strict=True):
        assert [p for _, p, _ in answers] == [0, 1]
        for _, p, data in answers:
            if p == served:
                assert data.records == history.expected_bytes(TOPIC, p, 0, 1000)
                assert data.high_watermark > 0
            else:
                assert (data.error_code, data.records, data.high_watermark,
                        data.log_start_offset) == (ErrorCode.none, b"", -1, -1)


def test_partitions_that_do_not_exist_leave_no_session_behind(daemon: Daemon) -> None:
    """A connection naming ever new partitions that do not exist keeps no read-cache session
    for them (its session set would otherwise grow with every request)."""
    from tiered.app.kafka_api.context import Connection
    from tiered.app.kafka_api.fetch import handle_fetch
    from tiered.app.kafka_api.wire import Request

    kafka = daemon.kafka
    assert kafka is not None
    wait_until(lambda: kafka.services is not None, "the endpoint to start")
    svc = kafka.services
    assert svc is not None
    conn = Connection(10**6, "127.0.0.1")
    for first in range(2, 2002, 500):
        body = _fetch_request(12, [(TOPIC, [(p, 0, 1000) for p in range(first, first + 500)]),
                                   (f"no-such-topic-{first}", [(0, 0, 1000)])])
        reply = handle_fetch(svc, conn, Request(FETCH, 12, 1, "test", body))
        reply.close()
    assert conn.sessions == set()
    reply = handle_fetch(svc, conn, Request(FETCH, 12, 2, "test", _fetch_request(
        12, [(TOPIC, [(1, 0, 1000)])])))
    reply.close()
    assert conn.sessions == {("kafka", conn.conn_id, TOPIC, 1)}
    for session in conn.sessions:
        svc.reader.close_reader(session)


# --- the 2,000-duplicate attack on a real process ----------------------------------------------


def _toml(data: dict[str, dict[str, Any]]) -> str:
    lines = []
    for section, table in data.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {json.dumps(value)}" for key, value in table.items())
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _tiered_run(history: History, base: Path) -> Iterator[tuple[subprocess.Popen[bytes], int,
                                                               str]]:
    """`tiered run` as its own process: a history server (`dirs = []`) over the bucket, so it
    archives nothing; yields the process, its Kafka port and its /health URL."""
    base.mkdir()
    config = base / "tiered.toml"
    config.write_text(_toml({
        "storage": dict(history.storage),
        "log": {"dirs": []},
        "cache": {"dir": str(base / "cache")},
        "cluster": {"storage_min_free_bytes": 0, "cloud_storage_cache_chunk_size": 8192},
        "kafka": {"listen": "127.0.0.1:0"},
    }))
    stderr = base / "stderr.txt"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(tiered_command("run", "--config", str(config),
                                               "--metrics-port", "0"),
                                stdout=subprocess.DEVNULL, stderr=err, env=child_env())
    try:
        found: dict[str, Any] = {}

        def started() -> bool:
            text = stderr.read_text()
            assert proc.poll() is None, text
            kafka = re.search(r"Kafka endpoint on 127\.0\.0\.1:(\d+)", text)
            health = re.search(r"metrics and health on (http://\S+) ", text)
            if kafka and health:
                found.update(port=int(kafka.group(1)), url=health.group(1) + "/health")
            return bool(found)

        wait_until(started, "tiered run to serve Kafka and HTTP", timeout_s=60)
        yield proc, found["port"], found["url"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _health(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _status_kib(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    assert match is not None, text
    return int(match.group(1))


def _send(client: RawClient, entity: Any) -> None:
    """`entity` as one request frame, its answer left unread."""
    cls = type(entity)
    header_cls = cls.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header_cls(
        request_api_key=cls.__api_key__, request_api_version=cls.__version__,
        correlation_id=7, client_id="attack"))
    entity_writer(cls)(buf, entity)
    client.send_frame(buf.getvalue())


def _read_answer(sock: socket.socket, most: int) -> bytes:
    """One response frame, refused unread when it is larger than `most` bytes."""
    head = b""
    while len(head) < 4:
        got = sock.recv(4 - len(head))
        assert got, "closed by the server"
        head += got
    (size,) = struct.unpack(">i", head)
    assert size <= most, f"an answer of {size} bytes"
    frame = bytearray(size)
    view = memoryview(frame)
    pos = 0
    while pos < size:
        n = sock.recv_into(view[pos:])
        assert n, "closed by the server"
        pos += n
    return bytes(frame)


@pytest.fixture(scope="module")
def attacked(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> History:
    """A bucket of its own: the attack's daemon shares nothing with the module's."""
    return build_history(moto_endpoint, tmp_path_factory.mktemp("attacked"))


def test_two_thousand_duplicates_keep_files_and_memory_bounded(
        attacked: History, tmp_path: Path) -> None:
    """One Fetch naming partition 0 two thousand times with max_bytes 2^31-1: one answer of
    one partition; the daemon's open files and memory stay bounded and /health stays ok."""
    history = attacked
    whole = _archived(history, 0)
    with _tiered_run(history, tmp_path / "daemon") as (proc, port, health):
        assert _health(health)[1]["status"] == "ok"
        fds = Path(f"/proc/{proc.pid}/fd")
        baseline = len(os.listdir(fds))
        peak = [baseline]
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.005):
                with contextlib.suppress(OSError):
                    peak[0] = max(peak[0], len(os.listdir(fds)))

        watcher = threading.Thread(target=watch)
        watcher.start()
        client = RawClient(port, timeout=120)
        try:
            request = _fetch_request(12, [(TOPIC, [(0, 0, INT32_MAX)] * 2000)])
            for _ in range(3):
                _send(client, request)
                frame = _read_answer(client.sock, 64 * MiB)
                assert whole in frame and frame.count(whole[:200]) == 1
        finally:
            done.set()
            watcher.join()
            client.close()
        hwm_mib = _status_kib(proc.pid, "VmHWM") / 1024
        print(f"\nattack: answers of {len(frame)} bytes; {baseline} files open before, "
              f"{peak[0]} at most during; VmHWM {hwm_mib:.0f} MiB")
        # one partition's chunk files (the cache's chunks are 8 KiB here) plus the daemon's own
        assert peak[0] <= baseline + 200, (baseline, peak[0])
        assert hwm_mib < 400
        after = _health(health)
        assert after[0] == 200 and after[1]["status"] == "ok", after
        assert "Too many open files" not in (tmp_path / "daemon" / "stderr.txt").read_text()


# --- corruption stops at the corrupt batch ---------------------------------------------------


@pytest.fixture(scope="module")
def damaged(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> History:
    """A history of its own to damage: the batch before last of partition 0's active segment
    (local only), and a batch in the middle of one of partition 1's segment objects."""
    history = build_history(moto_endpoint, tmp_path_factory.mktemp("damaged"))
    active = max((history.log_dir / f"{TOPIC}-0").glob("*.log"))
    headers = list(iter_batch_headers(active.read_bytes()))
    assert headers[-2].base_offset >= history.archived_end[(TOPIC, 0)]
    _damage_file(active, headers[-2].position)
    return history


def _damage_file(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position + 70] ^= 0xFF  # inside its records: the CRC-32C no longer matches
    path.write_bytes(bytes(data))


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _records_url(daemon: Daemon, partition: int, offset: int) -> str:
    return (f"{daemon.server.url}/v1/topics/{TOPIC}/partitions/{partition}/records"
            f"?offset={offset}&max_bytes={MiB}")


def _check_stops_at(daemon: Daemon, history: History, partition: int, victim_offset: int,
                    path: str, position: int) -> None:
    """Kafka and HTTP: a 1 MiB fetch from 0 answers every batch before the damage; one
    starting at the damaged batch fails (HTTP naming the file or key and byte)."""
    before = b"".join(d for base, _, d in history.batches[(TOPIC, partition)]
                      if base < victim_offset)
    assert 0 < len(before) < MiB
    assert daemon.kafka is not None
    client = RawClient(daemon.kafka.port)
    try:
        got = _answers(client.request(_fetch_request(12, [(TOPIC, [(partition, 0, MiB)])])))
        assert (got[0][2].error_code, got[0][2].records) == (ErrorCode.none, before)
        at = _answers(client.request(_fetch_request(12, [(TOPIC, [(partition, victim_offset,
                                                                   MiB)])])))
        assert (at[0][2].error_code, at[0][2].records) == (ErrorCode.corrupt_message, b"")
    finally:
        client.close()
    status, body = _get(_records_url(daemon, partition, 0))
    assert (status, body) == (200, before)
    status, body = _get(_records_url(daemon, partition, victim_offset))
    doc = json.loads(body)
    assert (status, doc["error"]) == (500, "CORRUPT_MESSAGE")
    assert (doc["path"], doc["position"]) == (path, position)
    assert f"{path}, byte {position}" in doc["message"]


def test_a_corrupt_local_batch_stops_fetches_just_before_it(damaged: History) -> None:
    """The damage near the end of the active segment: a fetch from offset 0 (the bucket, then
    the local log) answers every batch before it."""
    active = max((damaged.log_dir / f"{TOPIC}-0").glob("*.log"))
    victim = list(iter_batch_headers(active.read_bytes(), verify_crc=False))[-2]
    with running(damaged.config()) as daemon:
        _check_stops_at(daemon, damaged, 0, victim.base_offset, str(active), victim.position)


def test_a_corrupt_remote_batch_stops_fetches_just_before_it(damaged: History) -> None:
    """The damage in the middle of a segment object (and of its chunk): the intact batches
    before it, those of its own chunk included, are answered."""
    import boto3

    bucket, prefix = damaged.storage["url"].removeprefix("s3://").split("/", 1)
    s3 = boto3.client("s3", endpoint_url=damaged.storage["endpoint_url"],
                      region_name="us-east-1")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
    segments = sorted((o["Key"] for o in listed if o["Key"].endswith(".log")
                       and f"/{TOPIC}/1_" in o["Key"]),
                      key=lambda k: int(k.rsplit("/", 1)[1].split("-")[0]))
    key = segments[len(segments) // 3]
    data = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    headers = list(iter_batch_headers(bytes(data)))
    assert len(headers) >= 3
    victim = headers[len(headers) // 2]
    data[victim.position + 70] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    s3.close()
    assert victim.base_offset < damaged.local_start[(TOPIC, 1)]
    with running(damaged.config()) as daemon:
        _check_stops_at(daemon, damaged, 1, victim.base_offset,
                        key.removeprefix(prefix.rstrip("/") + "/"), victim.position)
