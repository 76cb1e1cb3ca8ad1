"""Hostile clients against a running `tiered run` Kafka endpoint, with a well-behaved bystander
measured throughout (docs/kafka-api.md, "Limits and security").

Set-up: a moto_server child process; topic `history`, 2 partitions of `--size-mb` MiB in closed
segments archived by the real archiver, plus a few batches in each active segment, the last
batch of partition 1's active segment damaged on disk; a real `tiered run` child process with
a [kafka] section (`max_connections = 50`, the defaults otherwise).

Each attack runs in turn over raw sockets while a bystander, on its own connection, asks for
Metadata and a 64 KiB Fetch every 50 ms and a sampler reads the daemon's resident memory every
20 ms. For every attack the JSON gives its `result` (what the daemon answered or did), the
bystander's latency during it (p50 / max in ms, and requests that failed), and the daemon's
resident peak during it (`rss_peak_mib`); `daemon_alive` at the end. The baseline is the
bystander's latency with no attack (`quiet`).

    python benchmarks/hostile.py [--size-mb 16] [--trickle-s 40]
"""

from __future__ import annotations

import argparse
import datetime
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (
    MIB,
    DaemonProcess,
    MotoServer,
    SampleProducer,
    archive_everything,
    daemon_config,
    emit,
    free_port,
    progress,
    versions,
)
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from tiered.app.kafka_api.messages import build, nested
from tiered.config import parse_config

TOPIC = "history"
BUCKET = "hostile"
#: Metadata v12 whose topics compact-array count is the varint ff ff ff ff 0f (31 bytes)
METADATA_V12_ATTACK = (struct.pack(">ihhih", 27, 3, 12, 1, 8) + b"attacker" + b"\x00"
                       + b"\xff\xff\xff\xff\x0f" + b"\x00\x00\x00")
#: Metadata v1 whose classic Int32 topics count is 2^31-1
METADATA_V1_ATTACK = struct.pack(">ihhihsi", 15, 3, 1, 1, 1, b"x", 2**31 - 1)


class Raw:
    """kio-encoded requests over one plain socket."""

    def __init__(self, port: int, timeout: float = 60.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._next = 1

    def request(self, entity: Any) -> tuple[Any, int]:
        """The decoded answer and its size in bytes."""
        import io

        cls = type(entity)
        buf = io.BytesIO()
        header_cls = cls.__header_schema__
        entity_writer(header_cls)(buf, header_cls(
            request_api_key=cls.__api_key__, request_api_version=cls.__version__,
            correlation_id=self._next, client_id="hostile"))
        entity_writer(cls)(buf, entity)
        self._next += 1
        data = buf.getvalue()
        self.sock.sendall(struct.pack(">i", len(data)) + data)
        size = struct.unpack(">i", self._exactly(4))[0]
        frame = self._exactly(size)
        resp = load_response_schema(cls.__api_key__, cls.__version__)
        _h, used = entity_reader(resp.__header_schema__)(frame, 0)
        return entity_reader(resp)(frame, used)[0], size

    def _exactly(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            got = self.sock.recv(min(n - len(out), 1 << 20))
            if not got:
                raise ConnectionError("closed by the server")
            out += got
        return bytes(out)

    def closed_by_server(self, wait_s: float = 10.0) -> bool:
        self.sock.settimeout(wait_s)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def metadata(topics: list[str] | None) -> Any:
    cls = load_request_schema(3, 1)
    return build(cls, topics=None if topics is None else tuple(
        build(nested(cls, "MetadataRequestTopic"), name=t) for t in topics))


def fetch(partitions: list[tuple[int, int, int]], max_bytes: int) -> Any:
    """Fetch v4 of `history`: (partition, offset, partition_max_bytes) each."""
    cls = load_request_schema(1, 4)
    parts = tuple(build(nested(cls, "FetchPartition"), partition=p, fetch_offset=o,
                        partition_max_bytes=m) for p, o, m in partitions)
    return build(cls, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=0,
                 max_bytes=max_bytes, isolation_level=0,
                 topics=(build(nested(cls, "FetchTopic"), topic=TOPIC, partitions=parts),))


class Bystander(threading.Thread):
    """A well-behaved client: Metadata and a 64 KiB Fetch every 50 ms, each round trip timed;
    a failure is counted and the connection made again."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.samples: list[tuple[float, float | None]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        client: Raw | None = None
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                if client is None:
                    client = Raw(self.port, timeout=30.0)
                client.request(metadata([TOPIC]))
                answer, _ = client.request(fetch([(0, 0, 64 * 1024)], 64 * 1024))
                ok = answer.responses[0].partitions[0].error_code == 0
                self.samples.append((started, time.monotonic() - started if ok else None))
            except (OSError, ConnectionError):
                self.samples.append((started, None))
                if client is not None:
                    client.close()
                client = None
            self.stop.wait(0.05)

    def between(self, start: float, end: float) -> dict[str, Any]:
        taken = [lat for at, lat in self.samples if start <= at < end]
        ok = sorted(lat * 1000 for lat in taken if lat is not None)
        return {"requests": len(taken), "failed": len(taken) - len(ok),
                "p50_ms": round(statistics.median(ok), 2) if ok else None,
                "max_ms": round(ok[-1], 2) if ok else None}


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.samples.append((time.monotonic(), int(line.split()[1]) * 1024))
            except OSError:
                return
            self.stop.wait(0.02)

    def peak_mib(self, start: float, end: float) -> float:
        inside = [rss for at, rss in self.samples if start <= at <= end]
        return round(max(inside, default=0) / MIB, 1)


def store_operations(daemon: DaemonProcess) -> float:
    total = 0.0
    for path in ("read", "write"):
        total += daemon.metric(f'tiered_store_operations_total{{path="{path}"}}')
    return total


# --- the attacks ------------------------------------------------------------------------------


def raw_frame(frame: bytes) -> Callable[[int, DaemonProcess], dict[str, Any]]:
    def attack(port: int, daemon: DaemonProcess) -> dict[str, Any]:
        client = Raw(port)
        client.sock.sendall(frame)
        closed = client.closed_by_server()
        client.close()
        return {"connection_closed": closed}
    return attack


def duplicates(port: int, daemon: DaemonProcess) -> dict[str, Any]:
    client = Raw(port, timeout=120.0)
    sizes, entries = [], []
    for _ in range(3):
        answer, size = client.request(fetch([(0, 0, 2**31 - 1)] * 2000, 2**31 - 1))
        sizes.append(size)
        entries.append(sum(len(t.partitions) for t in answer.responses))
    client.close()
    fds = len(list(Path(f"/proc/{daemon.proc.pid}/fd").iterdir()))
    return {"answer_bytes": sizes, "partition_entries": entries, "open_fds_after": fds}


def trickle(seconds: float) -> Callable[[int, DaemonProcess], dict[str, Any]]:
    def attack(port: int, daemon: DaemonProcess) -> dict[str, Any]:
        socks = []
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(struct.pack(">i", 100))  # a frame header, then a byte now and then
            socks.append(s)
        end = time.monotonic() + seconds
        closed: set[int] = set()
        while time.monotonic() < end:
            for i, s in enumerate(socks):
                if i in closed:
                    continue
                try:
                    s.sendall(b"\x00")
                except OSError:
                    closed.add(i)
            time.sleep(5.0)
        for i, s in enumerate(socks):  # a send may still go out after the daemon closed
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    closed.add(i)
            except BlockingIOError:
                pass
            except OSError:
                closed.add(i)
            s.close()
        return {"connections": 50, "closed_by_the_daemon": len(closed),
                "trickled_for_s": seconds}
    return attack


def unknown_topics(port: int, daemon: DaemonProcess) -> dict[str, Any]:
    client = Raw(port, timeout=120.0)
    out: dict[str, Any] = {}
    for round_ in ("first", "again"):
        before = store_operations(daemon)
        started = time.monotonic()
        answer, _ = client.request(metadata([f"nosuch-{i}" for i in range(2000)]))
        out[f"{round_}_s"] = round(time.monotonic() - started, 3)
        out[f"{round_}_store_requests"] = store_operations(daemon) - before
        out[f"{round_}_unknown"] = sum(t.error_code == 3 for t in answer.topics)
    client.close()
    return out


def offset_commits(port: int, daemon: DaemonProcess) -> dict[str, Any]:
    cls = load_request_schema(8, 2)
    topic_cls, part_cls = nested(cls, "OffsetCommitRequestTopic"), nested(
        cls, "OffsetCommitRequestPartition")

    def commit(topic: str, parts: list[tuple[int, int, str]]) -> list[int]:
        client = Raw(port)
        answer, _ = client.request(build(
            cls, group_id="hostile", generation_id_or_member_epoch=-1, member_id="",
            retention_time_ms=-1, topics=(build(topic_cls, name=topic, partitions=tuple(
                build(part_cls, partition_index=p, committed_offset=o, committed_metadata=m)
                for p, o, m in parts)),)))
        client.close()
        return [int(p.error_code) for t in answer.topics for p in t.partitions]

    def counts(codes: list[int]) -> dict[str, int]:
        return {str(c): codes.count(c) for c in sorted(set(codes))}

    return {
        "partitions_0_to_249_of_2": counts(commit(TOPIC, [(p, 5, "") for p in range(250)])),
        "unknown_topic": counts(commit("nosuch", [(0, 5, "")])),
        "offset_minus_7": counts(commit(TOPIC, [(0, -7, "")])),
        "metadata_5000_chars": counts(commit(TOPIC, [(0, 5, "m" * 5000)])),
    }


def corrupt_tail(port: int, daemon: DaemonProcess) -> dict[str, Any]:
    client = Raw(port)
    answer, _ = client.request(fetch([(1, 0, 1 << 20)], 1 << 20))
    client.close()
    part = answer.responses[0].partitions[0]
    return {"error_code": int(part.error_code), "record_bytes": len(part.records or b"")}


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="hostile.py", description=__doc__)
    parser.add_argument("--size-mb", type=int, default=16, help="archived MiB per partition")
    parser.add_argument("--trickle-s", type=float, default=40.0,
                        help="how long the 50 trickling connections go on")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tiered-hostile-") as tmp, MotoServer() as moto:
        work = Path(tmp)
        moto.create_bucket(BUCKET)
        producer = SampleProducer(work / "logs", TOPIC, 2, 4 * MIB, record_bytes=16 * 1024)
        try:
            producer.append_bytes(2 * args.size_mb * MIB)
            producer.roll_all()
            for _ in range(8):  # an active segment with a few batches in each partition
                producer.append_batch()
            producer.publish_high_watermarks()
        finally:
            producer.close()
        port = free_port()
        text = daemon_config(bucket=BUCKET, endpoint=moto.endpoint, log_dir=work / "logs",
                             cache_dir=work / "cache", cluster="log_retention_ms = -1",
                             sections=f'[kafka]\nlisten = "127.0.0.1:{port}"\n'
                                      "max_connections = 50")
        (work / "tiered.toml").write_text(text)
        import tomllib

        progress("archiving")
        archive_everything(parse_config(tomllib.loads(text), source="hostile"))
        active = sorted((work / "logs" / f"{TOPIC}-1").glob("*.log"))[-1]
        data = bytearray(active.read_bytes())
        data[-20] ^= 0xFF  # inside the last batch's records: its CRC no longer holds
        active.write_bytes(bytes(data))

        daemon = DaemonProcess(work / "tiered.toml", work / "tiered.log")
        daemon.settle()
        bystander, rss = Bystander(port), RssSampler(daemon.proc.pid)
        bystander.start()
        rss.start()
        attacks: list[tuple[str, Callable[[int, DaemonProcess], dict[str, Any]]]] = [
            ("quiet", lambda _p, _d: {"note": "no attack: the bystander's baseline"}),
            ("metadata_v12_varint_count", raw_frame(METADATA_V12_ATTACK)),
            ("metadata_v1_count_2^31-1", raw_frame(METADATA_V1_ATTACK)),
            ("fetch_one_partition_2000_times", duplicates),
            ("trickle_50_connections", trickle(args.trickle_s)),
            ("metadata_2000_unknown_topics", unknown_topics),
            ("offset_commit_abuse", offset_commits),
            ("corrupt_batch_in_local_tail", corrupt_tail),
        ]
        report: dict[str, Any] = {"attacks": {}}
        try:
            for name, attack in attacks:
                progress(name)
                started = time.monotonic()
                if name == "quiet":
                    time.sleep(3.0)
                result = attack(port, daemon)
                time.sleep(1.0)  # the bystander's next requests after it
                ended = time.monotonic()
                report["attacks"][name] = {
                    "result": result, "seconds": round(ended - started, 1),
                    "bystander": bystander.between(started, ended),
                    "rss_peak_mib": rss.peak_mib(started, ended)}
        finally:
            bystander.stop.set()
            rss.stop.set()
            bystander.join(timeout=60)
            report["daemon_alive"] = daemon.proc.poll() is None
            daemon.stop()
        report["versions"] = versions("boto3", "kio")
        return report


if __name__ == "__main__":
    emit(run(sys.argv[1:]))
