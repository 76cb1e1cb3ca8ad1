"""Hostile request frames against a running `tiered run` process (its own process, under a
4 GiB address-space limit, so a frame that made it allocate many GiB would kill it): the
31-byte Metadata v12 frame whose topics count is the varint ff ff ff ff 0f and a classic
Int32 count of 2^31-1 close only their own connection while others are served, and a mutation
fuzzer seeded with a request of every served API and version leaves the daemon up and a
consumer reading correct data (docs/kafka-api.md, "Limits and security")."""

from __future__ import annotations

import collections
import contextlib
import datetime
import random
import re
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import kafka
import pytest
from kio.schema.errors import ErrorCode
from support.kafka_endpoint import TOPIC, History, RawClient, Rec, request_class
from support.kafka_process import KafkaDaemonProcess, write_config
from support.kafka_requests import METADATA_V1_ATTACK, METADATA_V12_ATTACK, seeds, sized
from support.waiting import wait_until

from tiered.app.kafka_api.messages import build, nested

pytestmark = pytest.mark.timeout(600)

#: the daemon's address space: kio's 16 GiB for a count of 2^31-1 cannot be had in it
ADDRESS_SPACE = 4 << 30
#: the fuzzer's seed, frames and time budget: whichever of the two limits comes first
FUZZ_SEED = 0x7F1E_D31A
FUZZ_FRAMES = 5000
FUZZ_BUDGET_S = 60.0
#: how long the fuzzer waits for an answer before it gives up on that connection
ANSWER_WAIT_S = 2.0
PATIENCE_S = 120.0


@pytest.fixture
def tiered(history: History, tmp_path: Path) -> Iterator[KafkaDaemonProcess]:
    proc = KafkaDaemonProcess(write_config(tmp_path / "tiered.toml", history),
                              tmp_path / "tiered.log", address_space=ADDRESS_SPACE)
    try:
        yield proc
    finally:
        proc.stop()


def _died(tiered: KafkaDaemonProcess) -> str:
    """Why the daemon is gone: its exit status and the end of its log."""
    with contextlib.suppress(subprocess.TimeoutExpired):  # still running: the log says more
        tiered.proc.wait(timeout=10)
    return f"tiered run exit status {tiered.proc.returncode}; log ends:\n{tiered.log()[-3000:]}"


def _fetch_is_correct(client: RawClient, history: History) -> None:
    """A Fetch of partition 0 from offset 0 answers the stored batches byte for byte."""
    cls = request_class(1, 12)
    part = build(nested(cls, "FetchPartition"), partition=0, fetch_offset=0,
                 partition_max_bytes=3000, current_leader_epoch=-1, last_fetched_epoch=-1,
                 log_start_offset=-1)
    got = client.request(build(
        cls, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=0, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
        topics=(build(nested(cls, "FetchTopic"), topic=TOPIC, partitions=(part,)),),
        forgotten_topics_data=()))
    (answer,) = got.responses[0].partitions
    assert answer.error_code == ErrorCode.none
    assert answer.records == history.expected_bytes(TOPIC, 0, 0, 3000)


def _still_serving(tiered: KafkaDaemonProcess, history: History, bystander: RawClient) -> None:
    """The daemon is up, `bystander` (connected before the attack) and a new connection read
    correct data."""
    fresh = None
    try:
        _fetch_is_correct(bystander, history)
        fresh = RawClient(tiered.port)
        _fetch_is_correct(fresh, history)
    except OSError as exc:
        raise AssertionError(f"the daemon stopped serving ({exc}): {_died(tiered)}") from None
    finally:
        if fresh is not None:
            fresh.close()
    assert tiered.alive, _died(tiered)


@pytest.mark.parametrize("attack", [METADATA_V12_ATTACK, METADATA_V1_ATTACK],
                         ids=["metadata-v12-varint-count", "metadata-v1-int32-count"])
def test_a_count_the_frame_cannot_hold_closes_only_its_connection(
        history: History, tiered: KafkaDaemonProcess, attack: bytes) -> None:
    bystander = RawClient(tiered.port)
    bad = RawClient(tiered.port)
    try:
        _fetch_is_correct(bystander, history)
        bad.sock.sendall(attack)
        assert bad.closed_by_server()
        _still_serving(tiered, history, bystander)
        wait_until(lambda: "MetadataRequest.topics: an array of" in tiered.log(),
                   "the daemon to log the refused request", timeout_s=30)
    finally:
        bad.close()
        bystander.close()


# --- the fuzzer ---------------------------------------------------------------------------------

#: values that make a 2- or 4-byte count or length hostile (as unsigned big-endian words)
_WORDS = (0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE, 0x00010000, 0x7FFF, 0x8000, 0xFFFF,
          0x0100)
#: varints that are huge or too long
_VARINTS = (b"\xff\xff\xff\xff\x0f", b"\xff\xff\xff\x7f", b"\x80\x80\x80\x80\x80\x01",
            b"\xfe\xff\xff\xff\x0f")


def mutate(rng: random.Random, pool: list[bytes]) -> bytes:
    """One to three mutations of a seed: bit flips, hostile bytes, words and varints, cuts,
    insertions, deletions, splices with another seed. The api key and version stay as the
    seed has them in most frames, so the parsers of served versions get the bytes."""
    frame = bytearray(rng.choice(pool))
    for _ in range(rng.randint(1, 3)):
        low = 0 if rng.random() < 0.05 else min(4, len(frame))
        pos = rng.randrange(low, len(frame)) if len(frame) > low else low
        op = rng.randrange(8)
        if op == 0 and pos < len(frame):
            frame[pos] ^= 1 << rng.randrange(8)
        elif op == 1 and pos < len(frame):
            frame[pos] = rng.choice((0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF))
        elif op == 2:
            width = rng.choice((2, 4))
            word = rng.choice(_WORDS) & ((1 << (8 * width)) - 1)
            frame[pos:pos + width] = word.to_bytes(width, "big")
        elif op == 3:
            frame[pos:pos + 1] = rng.choice(_VARINTS)
        elif op == 4:
            del frame[pos:]
        elif op == 5:
            frame[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 6:
            other = rng.choice(pool)
            frame[pos:] = other[rng.randrange(len(other)):]
        else:
            del frame[pos:pos + rng.randint(1, 8)]
    return bytes(frame)


def _answer(sock: socket.socket) -> bytes | None:
    """The answer frame, or None when the server closed the connection."""
    head = _exactly(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    assert 4 <= size < 1 << 30, f"an answer of {size} bytes"
    return _exactly(sock, size)


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            return None
        out += got
    return out


def _kp_all(port: int, partition: int) -> list[Rec]:
    consumer = kafka.KafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}",
                                   enable_auto_commit=False, request_timeout_ms=60_000)
    try:
        tp = kafka.TopicPartition(TOPIC, partition)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        got: list[Rec] = []
        deadline = time.monotonic() + PATIENCE_S
        while not got or got[-1].offset < end - 1:
            assert time.monotonic() < deadline, "the consumer stopped making progress"
            for messages in consumer.poll(timeout_ms=500).values():
                got.extend(Rec(m.offset, m.timestamp, m.key, m.value, tuple(m.headers))
                           for m in messages)
        return got
    finally:
        consumer.close()


@pytest.mark.slow
def test_fuzzed_frames_leave_the_daemon_serving(history: History,
                                                tiered: KafkaDaemonProcess) -> None:
    rng = random.Random(FUZZ_SEED)
    pool = seeds()
    bystander = RawClient(tiered.port)
    _fetch_is_correct(bystander, history)
    recent: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=5)
    counts = collections.Counter[str]()
    conn: socket.socket | None = None

    def failed(why: str) -> str:
        frames = "\n".join(f"  #{n} ({len(f)} bytes): {f.hex()}" for n, f in recent)
        return (f"{why} after frame #{recent[-1][0]} of seed {FUZZ_SEED:#x}; the last frames "
                f"sent, newest last:\n{frames}\n{_died(tiered)}")

    start = time.monotonic()
    sent = 0
    try:
        while sent < FUZZ_FRAMES and time.monotonic() - start < FUZZ_BUDGET_S:
            frame = mutate(rng, pool)
            sent += 1
            recent.append((sent, frame))
            try:
                if conn is None:
                    conn = socket.create_connection(("127.0.0.1", tiered.port),
                                                    timeout=ANSWER_WAIT_S)
                conn.sendall(sized(frame))
                answer = _answer(conn)
            except TimeoutError:
                answer, outcome = None, "no answer in time"
            except ConnectionRefusedError:
                raise AssertionError(failed("the daemon refused connections")) from None
            except OSError:
                answer, outcome = None, "reset"
            else:
                outcome = "answered" if answer is not None else "closed"
            counts[outcome] += 1
            if answer is None and conn is not None:
                conn.close()
                conn = None
            if not tiered.alive:
                raise AssertionError(failed("the daemon died"))
    finally:
        if conn is not None:
            conn.close()
    elapsed = time.monotonic() - start
    print(f"fuzzer: {sent} frames in {elapsed:.1f} s: {dict(counts)}")
    assert sent >= min(FUZZ_FRAMES, 500), f"only {sent} frames in {elapsed:.0f} s"
    assert counts["answered"] and counts["closed"], counts
    assert tiered.alive, failed("the daemon died")
    _still_serving(tiered, history, bystander)
    bystander.close()
    # a consumer library reads every record, as written
    assert _kp_all(tiered.port, 1) == history.records[(TOPIC, 1)]
    # one line per client per minute, however many bad requests
    lines = len(re.findall(r"WARNING .*closing the connection from 127\.0\.0\.1", tiered.log()))
    assert 1 <= lines <= 2 + elapsed // 60, lines
    # a request a handler cannot answer is a bug, even when only its connection pays for it
    errors = [m.group(0) for m in re.finditer(r"ERROR .*internal error\n(?:(?!\d{4}-).*\n)*",
                                              tiered.log())]
    assert not errors, "\n".join(errors)[:5000]
    assert tiered.alive, _died(tiered)
