"""The Kafka endpoint with authentication and ACLs, driven by real clients: librdkafka
(confluent-kafka) over SASL_PLAINTEXT and SASL_SSL with SCRAM-SHA-512, SCRAM-SHA-256 and
PLAIN and over SSL with a client certificate, kafka-python with SCRAM-SHA-256 over SASL_SSL,
and kcat with SCRAM-SHA-512 over SASL_SSL. An allowed user reads the archived history byte
for byte; a user without an ACL sees no topic and is refused its records; wrong passwords and
unknown users are refused; prefixed ACLs, DENY and group ACLs apply; and an ACL added through
the bucket is enforced by running sidecars within the refresh interval."""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka
import kafka.errors
import pytest
from click.testing import CliRunner
from support.certs import Authority
from support.daemons import running
from support.kafka_endpoint import (
    KCAT_FORMAT,
    TOPIC,
    TXN_TOPIC,
    History,
    Rec,
    bootstrap,
    kafka_config,
    kcat_records,
)
from support.waiting import wait_until

from manifests.security import Acl, User, add_acl, make_credential, put_user
from tiered.app.daemon import Daemon
from tiered.app.security_view import REFRESH_S
from tiered.cli.main import cli
from tiered.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PATIENCE_S = 120.0
SCRAM = ("SCRAM-SHA-512", "SCRAM-SHA-256")
MECHANISMS = [*SCRAM, "PLAIN"]


class Users:
    """Users created in the bucket for this module, each with a fresh random password."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.passwords: dict[str, str] = {}

    def create(self, name: str) -> str:
        password = secrets.token_urlsafe(16)
        with open_store(self.history.config().store_settings()) as store:
            put_user(store, User(name, {m: make_credential(password, m) for m in SCRAM}))
        self.passwords[name] = password
        return password

    def allow(self, principal: str, kind: str, name: str, operation: str = "read", *,
              pattern: str = "literal", permission: str = "allow") -> None:
        with open_store(self.history.config().store_settings()) as store:
            add_acl(store, Acl(principal, kind, pattern, name, operation,  # type: ignore[arg-type]
                               permission))


@pytest.fixture(scope="module")
def users(history: History) -> Users:
    u = Users(history)
    for name in ("alice", "nobody", "prefixed", "denied", "grouper", "late"):
        u.create(name)
    u.allow("User:alice", "topic", TOPIC)
    u.allow("User:alice", "group", "alice-group")
    u.allow("User:prefixed", "topic", "hist", pattern="prefixed")
    u.allow("User:denied", "topic", "*")
    u.allow("User:denied", "topic", TXN_TOPIC, "all", permission="deny")
    u.allow("User:grouper", "topic", TOPIC)
    return u


@pytest.fixture(scope="module")
def server_pem(authority: Authority) -> Any:
    return authority.issue("server", cn="127.0.0.1", server=True)


@pytest.fixture(scope="module")
def sasl_plaintext(history: History, users: Users) -> Iterator[Daemon]:
    config = history.config(kafka={"sasl_mechanisms": MECHANISMS,
                                   "allow_plaintext_sasl": True}, cache="cache-sasl")
    with running(config) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def sasl_ssl(history: History, users: Users, server_pem: Any) -> Iterator[Daemon]:
    config = history.config(kafka={"sasl_mechanisms": MECHANISMS, "tls_cert": str(server_pem.cert),
                                   "tls_key": str(server_pem.key)}, cache="cache-sasl-ssl")
    with running(config) as daemon:
        yield daemon


def _ck_conf(daemon: Daemon, users: Users, user: str, mechanism: str, *,
             ca: Path | None = None, password: str | None = None, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap(daemon),
        "security.protocol": "SASL_SSL" if ca else "SASL_PLAINTEXT",
        "sasl.mechanisms": mechanism, "sasl.username": user,
        "sasl.password": users.passwords.get(user, "x") if password is None else password,
        "group.id": f"{user}-group", "enable.auto.commit": False,
        "enable.partition.eof": True, **extra}
    if ca is not None:
        conf["ssl.ca.location"] = str(ca)
    return conf


def _ck_read(conf: dict[str, Any], topic: str, partition: int, end: int) -> list[Rec]:
    consumer = confluent_kafka.Consumer(conf)
    got: list[Rec] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, partition,
                                                        confluent_kafka.OFFSET_BEGINNING)])
        deadline = time.monotonic() + PATIENCE_S
        while not got or got[-1].offset < end - 1:
            assert time.monotonic() < deadline, "the client stopped making progress"
            for m in consumer.consume(num_messages=100, timeout=0.5):
                if m.error() is None:
                    got.append(Rec(m.offset(), m.timestamp()[1], m.key(), m.value(),
                                   tuple(m.headers() or [])))
                elif m.error().code() != confluent_kafka.KafkaError._PARTITION_EOF:
                    raise AssertionError(f"consumer error: {m.error()}")
    finally:
        consumer.close()
    return got


def _topics(conf: dict[str, Any]) -> set[str]:
    """The topics an all-topics Metadata request lists, asked by kafka-python with the same
    credentials (librdkafka 2.16's all-topics Metadata v13 carries 3 bytes the endpoint's
    parser refuses, outside what this module tests)."""
    kw: dict[str, Any] = {"bootstrap_servers": conf["bootstrap.servers"],
                          "request_timeout_ms": 30_000}
    if conf["security.protocol"].startswith("SASL"):
        kw |= {"security_protocol": conf["security.protocol"],
               "sasl_mechanism": conf["sasl.mechanisms"],
               "sasl_plain_username": conf["sasl.username"],
               "sasl_plain_password": conf["sasl.password"]}
    else:
        kw |= {"security_protocol": "SSL"}
    if "ssl.ca.location" in conf:
        kw["ssl_cafile"] = conf["ssl.ca.location"]
    if "ssl.certificate.location" in conf:
        kw |= {"ssl_certfile": conf["ssl.certificate.location"],
               "ssl_keyfile": conf["ssl.key.location"]}
    consumer = kafka.KafkaConsumer(**kw)
    try:
        return set(consumer.topics())
    finally:
        consumer.close()


def _described(conf: dict[str, Any], topic: str) -> int:
    """The error code librdkafka's Metadata of `topic` alone carries (0: described)."""
    consumer = confluent_kafka.Consumer(conf)
    try:
        found = consumer.list_topics(topic=topic, timeout=30).topics[topic]
        return 0 if found.error is None else int(found.error.code())
    finally:
        consumer.close()


def _refused(conf: dict[str, Any]) -> bool:
    """Whether the endpoint refuses the client's authentication."""
    errors: list[confluent_kafka.KafkaError] = []
    consumer = confluent_kafka.Consumer({**conf, "error_cb": errors.append})

    def refused() -> bool:
        return any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors)

    try:
        deadline = time.monotonic() + 10
        while not refused() and time.monotonic() < deadline:
            consumer.poll(0.1)  # connects, and serves the error callbacks
        # refused, the client learns nothing: no metadata comes however long it asks
        with pytest.raises(confluent_kafka.KafkaException):
            consumer.list_topics(topic=TOPIC, timeout=1)
        return refused()
    finally:
        consumer.close()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_sasl_plaintext_allowed_user_reads_history_byte_identical(
        history: History, users: Users, sasl_plaintext: Daemon, mechanism: str) -> None:
    records = history.records[(TOPIC, 1)]
    conf = _ck_conf(sasl_plaintext, users, "alice", mechanism)
    assert _described(conf, TOPIC) == 0
    assert _ck_read(conf, TOPIC, 1, records[-1].offset + 1) == records


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_sasl_ssl_allowed_user_reads_history_byte_identical(
        history: History, users: Users, sasl_ssl: Daemon, authority: Authority,
        mechanism: str) -> None:
    records = history.records[(TOPIC, 0)]
    conf = _ck_conf(sasl_ssl, users, "alice", mechanism, ca=authority.ca)
    assert _ck_read(conf, TOPIC, 0, records[-1].offset + 1) == records


def test_kafka_python_scram_sha_256_over_sasl_ssl(history: History, users: Users,
                                                  sasl_ssl: Daemon, authority: Authority
                                                  ) -> None:
    records = history.records[(TOPIC, 1)]
    end = records[-1].offset + 1
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap(sasl_ssl), security_protocol="SASL_SSL",
        ssl_cafile=str(authority.ca), sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="alice", sasl_plain_password=users.passwords["alice"],
        enable_auto_commit=False)
    try:
        tp = kafka.TopicPartition(TOPIC, 1)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got: list[Rec] = []
        deadline = time.monotonic() + PATIENCE_S
        while not got or got[-1].offset < end - 1:
            assert time.monotonic() < deadline, "the client stopped making progress"
            for messages in consumer.poll(timeout_ms=500).values():
                got.extend(Rec(m.offset, m.timestamp, m.key, m.value, tuple(m.headers))
                           for m in messages)
        assert got == records
    finally:
        consumer.close()
    with pytest.raises(kafka.errors.KafkaError):
        kafka.KafkaConsumer(
            bootstrap_servers=bootstrap(sasl_ssl), security_protocol="SASL_SSL",
            ssl_cafile=str(authority.ca), sasl_mechanism="SCRAM-SHA-256",
            sasl_plain_username="alice", sasl_plain_password="wrong",
            request_timeout_ms=10_000, api_version_auto_timeout_ms=10_000)


def test_kcat_scram_sha_512_over_sasl_ssl(history: History, users: Users, sasl_ssl: Daemon,
                                          authority: Authority, kcat: str) -> None:
    records = history.records[(TOPIC, 1)]
    base = [kcat, "-b", bootstrap(sasl_ssl), "-X", "security.protocol=SASL_SSL",
            "-X", "sasl.mechanisms=SCRAM-SHA-512", "-X", "sasl.username=alice",
            "-X", f"ssl.ca.location={authority.ca}"]
    proc = subprocess.run([*base, "-X", f"sasl.password={users.passwords['alice']}",
                           "-C", "-t", TOPIC, "-p", "1", "-o", "beginning", "-e",
                           "-f", KCAT_FORMAT], capture_output=True, timeout=120, check=True)
    assert kcat_records(proc.stdout) == records
    bad = subprocess.run([*base, "-X", "sasl.password=wrong", "-L", "-m", "10"],
                         capture_output=True, timeout=120, check=False)
    assert bad.returncode != 0
    assert b"Authentication failed" in bad.stderr or b"SASL" in bad.stderr, bad.stderr


def test_a_user_without_acl_sees_no_topic_and_is_refused_records(
        history: History, users: Users, sasl_plaintext: Daemon) -> None:
    conf = _ck_conf(sasl_plaintext, users, "nobody", "SCRAM-SHA-512")
    assert _topics(conf) == set()
    assert _described(conf, TOPIC) == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_wrong_password_and_unknown_user_are_refused(users: Users, sasl_plaintext: Daemon,
                                                    mechanism: str) -> None:
    assert _refused(_ck_conf(sasl_plaintext, users, "alice", mechanism, password="wrong"))
    assert _refused(_ck_conf(sasl_plaintext, users, "mallory", mechanism, password="x"))


def test_prefixed_acl_and_deny(history: History, users: Users, sasl_plaintext: Daemon) -> None:
    prefixed = _ck_conf(sasl_plaintext, users, "prefixed", "SCRAM-SHA-256")
    assert _topics(prefixed) == {TOPIC}
    assert _described(prefixed, TXN_TOPIC) == (
        confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED)
    denied = _ck_conf(sasl_plaintext, users, "denied", "SCRAM-SHA-256")
    assert _topics(denied) == {TOPIC}
    assert _described(denied, TXN_TOPIC) == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    records = history.records[(TOPIC, 1)]
    assert _ck_read(denied, TOPIC, 1, records[-1].offset + 1) == records


def test_a_group_commit_needs_the_group_acl(users: Users, sasl_plaintext: Daemon) -> None:
    offsets = [confluent_kafka.TopicPartition(TOPIC, 1, 5)]
    grouper = confluent_kafka.Consumer(_ck_conf(sasl_plaintext, users, "grouper",
                                                "SCRAM-SHA-512"))
    try:
        with pytest.raises(confluent_kafka.KafkaException) as refused:
            grouper.commit(offsets=offsets, asynchronous=False)
        assert refused.value.args[0].code() == (
            confluent_kafka.KafkaError.GROUP_AUTHORIZATION_FAILED)
    finally:
        grouper.close()
    alice = confluent_kafka.Consumer(_ck_conf(sasl_plaintext, users, "alice", "SCRAM-SHA-512"))
    try:
        alice.commit(offsets=offsets, asynchronous=False)
        assert alice.committed([confluent_kafka.TopicPartition(TOPIC, 1)],
                               timeout=30)[0].offset == 5
    finally:
        alice.close()


def test_an_acl_added_through_the_bucket_is_enforced_by_every_sidecar(
        history: History, users: Users, sasl_plaintext: Daemon, tmp_path: Path) -> None:
    # a second sidecar on the same bucket: a history server with its own refresh
    other = kafka_config(history.base, history.storage, dirs=None,
                         kafka={"sasl_mechanisms": ["SCRAM-SHA-512"]}, cache="cache-other")
    with running(other) as second:
        daemons = (sasl_plaintext, second)
        confs = [_ck_conf(d, users, "late", "SCRAM-SHA-512") for d in daemons]
        assert all(_topics(c) == set() for c in confs)
        path = tmp_path / "admin.toml"
        storage = history.storage
        path.write_text("[storage]\n" + "".join(f'{k} = "{v}"\n' for k, v in storage.items()))
        result = CliRunner().invoke(cli, ["acl", "add", "--config", str(path), "--principal",
                                          "User:late", "--topic", TOPIC, "--operation", "read"])
        assert result.exit_code == 0, result.output
        for conf in confs:
            wait_until(lambda conf=conf: _topics(conf) == {TOPIC},  # type: ignore[misc]
                       "the new ACL to be enforced", timeout_s=REFRESH_S * 3 + 30)


def test_mutual_tls_names_the_principal_from_the_certificate(
        history: History, users: Users, authority: Authority, server_pem: Any) -> None:
    config = history.config(kafka={"tls_cert": str(server_pem.cert),
                                   "tls_key": str(server_pem.key),
                                   "tls_client_ca": str(authority.ca)}, cache="cache-mtls")
    alice = authority.issue("alice-client", cn="alice", ou="apps")
    stranger = authority.issue("stranger-client", cn="stranger")
    records = history.records[(TOPIC, 1)]
    with running(config) as daemon:
        def conf(pem: Any | None) -> dict[str, Any]:
            c = {"bootstrap.servers": bootstrap(daemon), "security.protocol": "SSL",
                 "ssl.ca.location": str(authority.ca), "group.id": "mtls",
                 "enable.auto.commit": False, "enable.partition.eof": True}
            if pem is not None:
                c |= {"ssl.certificate.location": str(pem.cert),
                      "ssl.key.location": str(pem.key)}
            return c

        assert _topics(conf(alice)) == {TOPIC}
        assert _ck_read(conf(alice), TOPIC, 1, records[-1].offset + 1) == records
        assert _topics(conf(stranger)) == set()
        errors: list[confluent_kafka.KafkaError] = []
        consumer = confluent_kafka.Consumer({**conf(None), "error_cb": errors.append})
        try:
            with pytest.raises(confluent_kafka.KafkaException):
                consumer.list_topics(topic=TOPIC, timeout=10)
        finally:
            consumer.close()
