"""Kafka-endpoint test helpers: Kafka logs with varied records (and transactions) written with the
log writer, the records a consumer must see, a `tiered run` daemon with a [kafka] section on a
thread, kcat installed from Debian's packages when missing, and a raw protocol client (kio)."""

from __future__ import annotations

import io
import random
import shutil
import socket
import struct
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from manifests import segment_indexes
from support.remote import LogImage, archive
from support.s3 import condition_form
from tiered.app.daemon import Daemon
from tiered.config import Config, parse_config
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.local_log import LocalLog
from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks
from tiered.kafka.records import Header, iter_batches
from tiered.store import StoreSettings, open_store
from tiered.store.s3 import S3Store

#: record timestamps start here, ms since the epoch, 3 ms apart
T0_MS = 1_700_000_000_000
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


@dataclass(frozen=True)
class Rec:
    """One record as a consumer sees it: every field compared byte for byte."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def _records(rng: random.Random, first: int, count: int) -> list[ProducerRecord]:
    out = []
    for i in range(count):
        o = first + i
        key = None if o % 7 == 0 else f"key-{o}".encode()
        value = None if o % 13 == 5 else rng.randbytes(10 + rng.randrange(200))
        headers: tuple[Header, ...] = ()
        if o % 3 == 1:
            headers = (Header("trace", f"t{o}".encode()), Header("empty", None))
        out.append(ProducerRecord(value, key, headers, timestamp=T0_MS + 3 * o))
    return out


def write_history(log_dir: Path, topic: str, partition: int, *, batches: int, seed: int,
                  segment_bytes: int = 4096) -> int:
    """Batches of 1..4 varied records over every codec, in segments of `segment_bytes`, all
    closed; returns the log end offset."""
    rng = random.Random(seed)
    with LogWriter(log_dir / f"{topic}-{partition}", segment_bytes=segment_bytes, fsync=False,
                   index_interval_bytes=512, topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, topic),
                   clock=lambda: T0_MS / 1000) as w:
        w.become_leader(2)
        for b in range(batches):
            w.append(_records(rng, w.log_end_offset, 1 + b % 4), compression=CODECS[b % 5])
        w.roll()
        end = w.log_end_offset
    write_high_watermarks(log_dir, {TopicPartition(topic, partition): end}, fsync=False)
    return end


def append_local(log_dir: Path, topic: str, partition: int, *, batches: int, seed: int) -> int:
    """More batches in the active segment only (never archived); returns the new end."""
    rng = random.Random(seed)
    with LogWriter(log_dir / f"{topic}-{partition}", segment_bytes=1 << 30, fsync=False,
                   clock=lambda: T0_MS / 1000) as w:
        for _ in range(batches):
            w.append(_records(rng, w.log_end_offset, 2))
        end = w.log_end_offset
    write_high_watermarks(log_dir, {TopicPartition(topic, partition): end}, fsync=False)
    return end


@dataclass
class Transactions:
    """What a transactional log holds: every data record and the aborted ones' offsets."""

    records: list[Rec] = field(default_factory=list)
    aborted_offsets: set[int] = field(default_factory=set)
    control_offsets: set[int] = field(default_factory=set)

    @property
    def committed(self) -> list[Rec]:
        return [r for r in self.records if r.offset not in self.aborted_offsets]


def write_transactions(log_dir: Path, topic: str, *, seed: int, rounds: int = 120) -> int:
    """One partition of interleaved transactions of three producers (some committed, some
    aborted, with their control batches and `.txnindex` entries) and plain batches; every
    transaction is closed by the end. Returns the log end offset."""
    rng = random.Random(seed)
    open_txn: dict[int, list[int]] = {}
    with LogWriter(log_dir / f"{topic}-0", segment_bytes=2048, fsync=False,
                   topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, topic),
                   clock=lambda: T0_MS / 1000) as w:
        for _ in range(rounds):
            pid = 1000 + rng.randrange(3)
            roll = rng.random()
            if roll < 0.25:
                w.append(_records(rng, w.log_end_offset, 2))
            elif pid in open_txn and roll < 0.45:
                w.append_control(rng.choice(["commit", "abort"]), producer_id=pid,
                                 producer_epoch=0)
                del open_txn[pid]
            else:
                got = w.append(_records(rng, w.log_end_offset, 1 + rng.randrange(3)),
                               producer_id=pid, producer_epoch=0,
                               base_sequence=len(open_txn.get(pid, [])), transactional=True)
                open_txn.setdefault(pid, []).append(got.base_offset)
        for pid in sorted(open_txn):
            w.append_control("abort", producer_id=pid, producer_epoch=0)
        w.roll()
        end = w.log_end_offset
    write_high_watermarks(log_dir, {TopicPartition(topic, 0): end}, fsync=False)
    return end


def read_log(directory: Path) -> tuple[list[Rec], Transactions]:
    """Every data record of a partition directory, and which offsets aborted transactions
    and control batches hold (from the markers, independently of any `.txnindex`)."""
    txns = Transactions()
    open_by_pid: dict[int, list[int]] = {}
    for path in sorted(directory.glob("*.log")):
        for batch in iter_batches(path.read_bytes()):
            h = batch.header
            if h.is_control:
                txns.control_offsets.update(r.offset for r in batch.records)
                offsets = open_by_pid.pop(h.producer_id, [])
                if batch.control_type == "abort":
                    txns.aborted_offsets.update(offsets)
                continue
            for r in batch.records:
                txns.records.append(Rec(r.offset, r.timestamp, r.key, r.value,
                                        tuple((x.key, x.value) for x in r.headers)))
                if h.is_transactional:
                    open_by_pid.setdefault(h.producer_id, []).append(r.offset)
    return txns.records, txns


def drop_closed_below(log_dir: Path, topic: str, partition: int, below: int) -> int:
    """Delete local segments (all their files) ending below `below`, as local retention does
    once the bucket has them; returns the new local log start."""
    part = LocalLog([log_dir]).partition(TopicPartition(topic, partition))
    for seg in part.closed_segments:
        last = seg.last_offset()
        if last is not None and last < below:
            for path in (seg.log_path, seg.index_path, seg.timeindex_path, seg.txnindex_path):
                path.unlink(missing_ok=True)
    start = LocalLog([log_dir]).partition(TopicPartition(topic, partition)).log_start_offset
    assert start is not None
    return start


TOPIC = "history"
TXN_TOPIC = "txn"


@dataclass
class History:
    base: Path
    log_dir: Path
    storage: dict[str, Any]
    #: (topic, partition) -> every data record, in offset order
    records: dict[tuple[str, int], list[Rec]]
    #: (topic, partition) -> the local log start after the deletion
    local_start: dict[tuple[str, int], int]
    txn: Transactions
    #: (topic, partition) -> every batch as stored: (base offset, last offset, bytes)
    batches: dict[tuple[str, int], list[tuple[int, int, bytes]]]
    #: (topic, partition) -> one past the last offset in the bucket
    archived_end: dict[tuple[str, int], int]

    def config(self, **kw: Any) -> Any:
        return kafka_config(self.base, self.storage, dirs=[self.log_dir], **kw)

    def store_settings(self) -> StoreSettings:
        s = self.storage
        return StoreSettings(url=s["url"], endpoint_url=s["endpoint_url"], region="us-east-1",
                             access_key="testing", secret_key="testing")

    def store(self) -> S3Store:
        """The bucket as tiered opens it, with the If-Match spelling the server enforces (Ceph
        RGW compares the bare ETag): compare-and-swap tests fail every swap without it."""
        store = S3Store(self.store_settings())
        store.use_condition_form(condition_form(self.storage["endpoint_url"]))
        return store

    def expected_bytes(self, topic: str, partition: int, offset: int, max_bytes: int,
                       *, first: bool = True) -> bytes:
        """Kafka's answer: whole batches from the one holding `offset` while they fit
        `max_bytes`, the first whatever its size when `first`."""
        out = b""
        for _base, last, data in self.batches[(topic, partition)]:
            if last < offset:
                continue
            if len(out) + len(data) > max_bytes and (out or not first):
                break
            out += data
        return out


def build_history(moto_endpoint: str, base: Path) -> History:
    """The topics of the Kafka-endpoint tests (tests/test_kafka_api/conftest.py), archived
    into a new bucket on `moto_endpoint` and partly deleted locally."""
    log_dir = base / "logs"
    log_dir.mkdir()
    bucket = f"tiered-kafka-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    client.close()
    storage = {"url": f"s3://{bucket}/pfx", "endpoint_url": moto_endpoint,
               "region": "us-east-1", "access_key": "testing", "secret_key": "testing"}
    ends = {0: write_history(log_dir, TOPIC, 0, batches=160, seed=1),
            1: write_history(log_dir, TOPIC, 1, batches=90, seed=2)}
    txn_end = write_transactions(log_dir, TXN_TOPIC, seed=3)
    # every record, read before anything is deleted
    records = {(TOPIC, p): read_log(log_dir / f"{TOPIC}-{p}")[0] for p in ends}
    batches = {(TOPIC, p): LogImage.of(log_dir / f"{TOPIC}-{p}").batches for p in ends}
    txn = read_log(log_dir / f"{TXN_TOPIC}-0")[1]
    assert txn.aborted_offsets and txn.control_offsets, "the log needs aborted transactions"
    config = kafka_config(base, storage, dirs=[log_dir])
    # probed as tiered opens it: the probe finds the If-Match spelling the server enforces
    # (Ceph RGW takes the bare ETag only)
    with open_store(config.store_settings()) as store:
        archive(config, store)
        assert any("txnindex" in segment_indexes.decode_bundle(store.get(i.key))
                   for i in store.list("") if i.key.endswith(".indexes"))
    local_start = {(TOPIC, p): drop_closed_below(log_dir, TOPIC, p, end // 2)
                   for p, end in ends.items()}
    local_start[(TXN_TOPIC, 0)] = drop_closed_below(log_dir, TXN_TOPIC, 0, txn_end // 2)
    assert all(start > 0 for start in local_start.values())
    append_local(log_dir, TOPIC, 0, batches=12, seed=4)  # a tail that is only local
    tail = [r for r in read_log(log_dir / f"{TOPIC}-0")[0] if r.offset >= ends[0]]
    assert tail
    records[(TOPIC, 0)] += tail
    batches[(TOPIC, 0)] += [b for b in LogImage.of(log_dir / f"{TOPIC}-0").batches
                            if b[0] >= ends[0]]
    archived = {(TOPIC, p): end for p, end in ends.items()} | {(TXN_TOPIC, 0): txn_end}
    return History(base, log_dir, storage, records, local_start, txn, batches, archived)


# --- the daemon --------------------------------------------------------------------------------


def kafka_config(base: Path, storage: Mapping[str, Any], *, dirs: list[Path] | None,
                 kafka: Mapping[str, Any] | None = None, cache: str = "cache") -> Config:
    """A config over `storage` serving Kafka on a free loopback port; `dirs` None: a history
    server (`dirs = []`)."""
    data: dict[str, Any] = {
        "storage": dict(storage),
        "log": {"dirs": [str(d) for d in dirs or []], "retention": "advise"},
        "cache": {"dir": str(base / cache)},
        "cluster": {"storage_min_free_bytes": 0, "cloud_storage_cache_chunk_size": 8192,
                    "log_retention_ms": -1},
        "kafka": {"listen": "127.0.0.1:0", "group_initial_rebalance_delay_ms": 0,
                  "group_min_session_timeout_ms": 1000, **(kafka or {})},
    }
    return parse_config(data, source="test", base_dir=base)


def bootstrap(daemon: Daemon) -> str:
    assert daemon.kafka is not None
    return f"127.0.0.1:{daemon.kafka.port}"


# --- kcat ---------------------------------------------------------------------------------------


def ensure_kcat() -> str:
    """kcat's path. Tests never change the host: `.ci/run` installs Debian's `kcat` package;
    where it is missing the kcat tests skip, naming the tool."""
    found = shutil.which("kcat") or shutil.which("kafkacat")
    if found:
        return found
    message = "kcat is not installed (Debian package 'kcat'; .ci/run installs it): skipped"
    print(f"\n*** {message} ***", file=sys.stderr)
    pytest.skip(message)


def kcat_records(output: bytes) -> list[Rec]:
    """Parse kcat's `-f '%o %T %K %S [%h] <%k><%s>\\n'` output, keys and values by length
    (so any bytes round-trip); header values are text here."""
    out = []
    pos = 0
    while pos < len(output):
        head_end = output.index(b" [", pos)
        offset, ts, klen, vlen = (int(x) for x in output[pos:head_end].split())
        hdr_end = output.index(b"] <", head_end)
        headers = tuple(_kcat_header(h) for h in output[head_end + 2:hdr_end].split(b",") if h)
        pos = hdr_end + 3
        key = None if klen < 0 else output[pos:pos + klen]
        pos += max(klen, 0)
        assert output[pos:pos + 2] == b"><", output[pos - 20:pos + 20]
        pos += 2
        value = None if vlen < 0 else output[pos:pos + vlen]
        pos += max(vlen, 0)
        assert output[pos:pos + 2] == b">\n"
        pos += 2
        out.append(Rec(offset, ts, key, value, headers))
    return out


def _kcat_header(text: bytes) -> tuple[str, bytes | None]:
    name, _, value = text.partition(b"=")
    return name.decode(), None if value == b"NULL" else value


KCAT_FORMAT = "%o %T %K %S [%h] <%k><%s>\n"


# --- a raw protocol client ------------------------------------------------------------------------


class RawClient:
    """Requests encoded with kio over a plain socket: for what a client library hides (byte
    budgets, exact record bytes, malformed frames)."""

    def __init__(self, port: int, timeout: float = 30.0, *, source: str | None = None) -> None:
        self.sock = socket.create_connection(
            ("127.0.0.1", port), timeout=timeout,
            source_address=None if source is None else (source, 0))
        self._next = 1

    def request(self, entity: Any, *, version_header: bool = True) -> Any:
        cls = type(entity)
        header_cls = cls.__header_schema__
        buf = io.BytesIO()
        entity_writer(header_cls)(buf, header_cls(
            request_api_key=cls.__api_key__, request_api_version=cls.__version__,
            correlation_id=self._next, client_id="raw-test"))
        entity_writer(cls)(buf, entity)
        self.send_frame(buf.getvalue())
        self._next += 1
        frame = self.read_frame()
        resp_cls = load_response_schema(cls.__api_key__, cls.__version__)
        _header, used = entity_reader(resp_cls.__header_schema__)(frame, 0)
        body, _size = entity_reader(resp_cls)(frame, used)
        return body

    def send_frame(self, data: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(data)) + data)

    def read_frame(self) -> bytes:
        head = self._exactly(4)
        return self._exactly(struct.unpack(">i", head)[0])

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            got = self.sock.recv(n - len(out))
            if not got:
                raise ConnectionError("closed by the server")
            out += got
        return out

    def closed_by_server(self) -> bool:
        """True when the server closed this connection (reads EOF)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def request_class(api_key: int, version: int) -> Any:
    return load_request_schema(api_key, version)
