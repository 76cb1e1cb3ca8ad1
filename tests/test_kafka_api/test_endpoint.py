"""The endpoint as an operator configures it: TLS with the stdlib (kafka-python, librdkafka and
kcat verify the server's certificate), the connection limit, a history server with no log
dirs serving the bucket alone, and clear errors instead of a start for a busy port or bad
certificate files."""

from __future__ import annotations

import datetime
import functools
import ipaddress
import select
import socket
import subprocess
import time
from pathlib import Path

import confluent_kafka
import kafka
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from support.daemons import running
from support.kafka_endpoint import (
    KCAT_FORMAT,
    TOPIC,
    TXN_TOPIC,
    History,
    RawClient,
    Rec,
    bootstrap,
    kafka_config,
    kcat_records,
)
from support.waiting import wait_until

from tiered.app.daemon import Daemon, DaemonOptions
from tiered.app.serving import State
from tiered.errors import ConfigError, TieredError

pytestmark = pytest.mark.timeout(300)

PATIENCE_S = 120.0


def _self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "server.pem", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def _kp_all(consumer: kafka.KafkaConsumer, partition: int, end: int) -> list[Rec]:
    tp = kafka.TopicPartition(TOPIC, partition)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    got: list[Rec] = []
    deadline = time.monotonic() + PATIENCE_S
    while not got or got[-1].offset < end - 1:
        assert time.monotonic() < deadline, "the client stopped making progress"
        for messages in consumer.poll(timeout_ms=500).values():
            got.extend(Rec(m.offset, m.timestamp, m.key, m.value, tuple(m.headers))
                       for m in messages)
    return got


def test_tls_serves_every_client(history: History, tmp_path: Path, kcat: str) -> None:
    cert, key = _self_signed(tmp_path)
    records = history.records[(TOPIC, 1)]
    end = records[-1].offset + 1
    config = history.config(kafka={"tls_cert": str(cert), "tls_key": str(key)}, cache="cache-tls")
    with running(config) as daemon:
        consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap(daemon),
                                       security_protocol="SSL", ssl_cafile=str(cert),
                                       enable_auto_commit=False)
        try:
            assert _kp_all(consumer, 1, end) == records
        finally:
            consumer.close()
        ck = confluent_kafka.Consumer({"bootstrap.servers": bootstrap(daemon),
                                       "security.protocol": "SSL",
                                       "ssl.ca.location": str(cert), "group.id": "tls",
                                       "enable.auto.commit": False,
                                       "enable.partition.eof": True})
        got: list[Rec] = []
        try:
            ck.assign([confluent_kafka.TopicPartition(TOPIC, 1, confluent_kafka.OFFSET_BEGINNING)])
            deadline = time.monotonic() + PATIENCE_S
            while not got or got[-1].offset < end - 1:
                assert time.monotonic() < deadline, "the client stopped making progress"
                for m in ck.consume(num_messages=100, timeout=0.5):
                    if m.error() is None:
                        got.append(Rec(m.offset(), m.timestamp()[1], m.key(), m.value(),
                                       tuple(m.headers() or [])))
        finally:
            ck.close()
        assert got == records
        proc = subprocess.run([kcat, "-b", bootstrap(daemon), "-X", "security.protocol=ssl",
                               "-X", f"ssl.ca.location={cert}", "-C", "-t", TOPIC, "-p", "1",
                               "-o", "beginning", "-e", "-f", KCAT_FORMAT],
                              capture_output=True, timeout=120, check=True)
        assert kcat_records(proc.stdout) == records
        # a plain-TCP client gets no answer, and the TLS side goes on serving
        assert daemon.kafka is not None
        plain = RawClient(daemon.kafka.port, timeout=10)
        plain.send_frame(b"\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00")
        assert plain.closed_by_server()
        plain.close()


def test_a_stalled_tls_handshake_is_cut_at_the_request_deadline(history: History,
                                                               tmp_path: Path) -> None:
    """A handshake is a request: a client that opens a TLS connection and trickles its
    ClientHello is closed within request_timeout_ms, though each byte comes long before the
    socket timeout; a real TLS client is served meanwhile."""
    cert, key = _self_signed(tmp_path)
    config = history.config(kafka={"tls_cert": str(cert), "tls_key": str(key),
                                   "request_timeout_ms": 1000}, cache="cache-tls-stall")
    with running(config) as daemon:
        assert daemon.kafka is not None
        stalled = socket.create_connection(("127.0.0.1", daemon.kafka.port), timeout=30)
        # a TLS record of 512 bytes: a ClientHello of 508 (TLS 1.2), its random bytes, ...
        hello = b"\x16\x03\x01\x02\x00" + b"\x01\x00\x01\xfc\x03\x03" + bytes(506)
        sent = 0
        try:
            while sent < len(hello):
                readable, _, _ = select.select([stalled], [], [], 0.1)
                if readable and stalled.recv(1) == b"":
                    break
                stalled.sendall(hello[sent:sent + 1])
                sent += 1
        except OSError:
            pass
        finally:
            stalled.close()
        assert sent < len(hello)  # closed mid-handshake
        consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap(daemon),
                                       security_protocol="SSL", ssl_cafile=str(cert))
        try:
            assert TOPIC in consumer.topics()
        finally:
            consumer.close()


def _all_idle_on_server(daemon: Daemon) -> bool:
    """Whether every connection the daemon's Kafka endpoint holds waits for its client's next
    request (its own view, which the connection limits decide on)."""
    assert daemon.kafka is not None
    clients = list(daemon.kafka._server._clients.values())
    return all(client.state is State.IDLE for client, _thread in clients)


def test_at_the_limit_the_connection_idle_the_longest_makes_room(history: History) -> None:
    """Beyond max_connections, the connection that waited on its client the longest is
    closed so the newcomer is served; the others go on."""
    with running(history.config(kafka={"max_connections": 2}, cache="cache-limit")) as daemon:
        assert daemon.kafka is not None
        port = daemon.kafka.port
        first, second = RawClient(port), RawClient(port)
        for c in (first, second):  # both served, then idle: first the longest
            c.send_frame(b"\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00")
            assert c.read_frame()[:4] == b"\x00\x00\x00\x01"
            # the client has its answer before the server's thread records the connection
            # idle again: wait for that, so the first is the longest idle on the server's
            # side too
            wait_until(functools.partial(_all_idle_on_server, daemon),
                       "the daemon to count the connection idle")
        third = RawClient(port)
        third.send_frame(b"\x00\x12\x00\x00\x00\x00\x00\x02\x00\x00")
        assert third.read_frame()[:4] == b"\x00\x00\x00\x02"
        assert first.closed_by_server()
        second.send_frame(b"\x00\x12\x00\x00\x00\x00\x00\x03\x00\x00")
        assert second.read_frame()[:4] == b"\x00\x00\x00\x03"
        for c in (first, second, third):
            c.close()
        stats = daemon.kafka.stats()
        assert stats["connections_reclaimed"] == 1 and stats["connections_refused"] == 0


def test_a_history_server_serves_the_bucket_alone(history: History) -> None:
    """`[log] dirs = []`: no local log, topics from the bucket's topic manifests, every
    archived offset readable; nothing past the bucket's end (the local tail is not there)."""
    config = kafka_config(history.base, history.storage, dirs=None, cache="cache-history")
    assert config.history_server
    with running(config) as daemon:
        consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap(daemon),
                                       enable_auto_commit=False)
        try:
            assert consumer.topics() >= {TOPIC, TXN_TOPIC}
            assert consumer.partitions_for_topic(TOPIC) == {0, 1}
            archived = history.archived_end[(TOPIC, 0)]
            got = _kp_all(consumer, 0, archived)
            assert got == [r for r in history.records[(TOPIC, 0)] if r.offset < archived]
            tp = kafka.TopicPartition(TOPIC, 0)
            assert consumer.end_offsets([tp]) == {tp: archived}
        finally:
            consumer.close()
        health = daemon.state
        assert health.archiving is False and not health.jobs  # nothing is archived


def test_a_busy_port_is_a_clear_error(history: History) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        config = history.config(kafka={"listen": f"127.0.0.1:{port}"}, cache="cache-busy")
        with pytest.raises(TieredError, match=f"cannot serve Kafka on 127.0.0.1:{port}"):
            Daemon(config, DaemonOptions(metrics_port=0))


@pytest.mark.parametrize("broken", ["missing", "garbage"])
def test_bad_certificate_files_name_the_key(history: History, tmp_path: Path,
                                            broken: str) -> None:
    cert, key = _self_signed(tmp_path)
    if broken == "missing":
        key.unlink()
    else:
        cert.write_text("not a certificate")
    config = history.config(kafka={"tls_cert": str(cert), "tls_key": str(key)}, cache="c-bad")
    with pytest.raises(ConfigError, match=r"\[kafka\] tls_"):
        Daemon(config, DaemonOptions(metrics_port=0))
