"""The endpoint's SASL and ACLs at the protocol level (kio-encoded requests over a socket):
what clients hide. Only ApiVersions and SASL before authenticating; SCRAM through
SaslAuthenticate and through SaslHandshake v0's bare tokens; a failure answers
SASL_AUTHENTICATION_FAILED and closes; Fetch and ListOffsets without READ get
TOPIC_AUTHORIZATION_FAILED; DescribeAcls shows the bucket's ACLs; CreateAcls is refused;
and KIP-368 sessions end unless re-authenticated, as the same principal."""

from __future__ import annotations

import datetime
import secrets
import struct
from collections.abc import Iterator
from typing import Any

import pytest
import scramp
from kio.schema.errors import ErrorCode
from support.daemons import running
from support.kafka_endpoint import TOPIC, TXN_TOPIC, History, RawClient, request_class
from support.waiting import wait_until

from manifests.security import Acl, User, add_acl, make_credential, put_user
from tiered.app.daemon import Daemon
from tiered.app.kafka_api.messages import build, nested
from tiered.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FETCH, LIST_OFFSETS, METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE = 1, 2, 3, 17, 36
DESCRIBE_ACLS, CREATE_ACLS = 29, 30
PASSWORDS: dict[str, str] = {}


@pytest.fixture(scope="module")
def daemon(history: History) -> Iterator[Daemon]:
    with open_store(history.config().store_settings()) as store:
        for name in ("alice", "ops", "bob"):
            PASSWORDS[name] = secrets.token_urlsafe(12)
            put_user(store, User(name, {m: make_credential(PASSWORDS[name], m)
                                        for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")}))
        add_acl(store, Acl("User:alice", "topic", "literal", TOPIC, "read",  # type: ignore[arg-type]
                           "allow"))
        add_acl(store, Acl("User:ops", "cluster", "literal", "kafka-cluster",  # type: ignore[arg-type]
                           "describe", "allow"))
    config = history.config(kafka={"sasl_mechanisms": ["SCRAM-SHA-256", "SCRAM-SHA-512"],
                                   "session_lifetime_ms": "3s"}, cache="cache-raw")
    with running(config) as d:
        yield d


def _client(daemon: Daemon) -> RawClient:
    assert daemon.kafka is not None
    return RawClient(daemon.kafka.port, timeout=30)


def _handshake(client: RawClient, mechanism: str, version: int = 1) -> Any:
    return client.request(build(request_class(SASL_HANDSHAKE, version), mechanism=mechanism))


def _authenticate(client: RawClient, token: bytes) -> Any:
    return client.request(build(request_class(SASL_AUTHENTICATE, 2), auth_bytes=token))


def login(client: RawClient, user: str, password: str,
          mechanism: str = "SCRAM-SHA-512") -> Any:
    """SCRAM through SaslHandshake v1 and SaslAuthenticate v2; the last answer."""
    assert _handshake(client, mechanism).error_code == ErrorCode.none
    scram = scramp.ScramClient([mechanism], user, password)
    first = _authenticate(client, scram.get_client_first().encode())
    assert first.error_code == ErrorCode.none, first
    scram.set_server_first(first.auth_bytes.decode())
    final = _authenticate(client, scram.get_client_final().encode())
    if final.error_code == ErrorCode.none:
        scram.set_server_final(final.auth_bytes.decode())  # the server proved itself too
    return final


def _metadata(client: RawClient) -> Any:
    return client.request(build(request_class(METADATA, 12), topics=None,
                                allow_auto_topic_creation=False))


def _fetch_error(client: RawClient, topic: str) -> ErrorCode:
    cls = request_class(FETCH, 12)
    part = build(nested(cls, "FetchPartition"), partition=0, fetch_offset=0,
                 partition_max_bytes=1 << 20, current_leader_epoch=-1, last_fetched_epoch=-1,
                 log_start_offset=-1)
    got = client.request(build(cls, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=0,
                               max_bytes=1 << 20, isolation_level=0, session_id=0,
                               session_epoch=-1, forgotten_topics_data=(), rack_id="",
                               topics=(build(nested(cls, "FetchTopic"), topic=topic,
                                             partitions=(part,)),)))
    return ErrorCode(got.responses[0].partitions[0].error_code)


def _list_offsets_error(client: RawClient, topic: str) -> ErrorCode:
    cls = request_class(LIST_OFFSETS, 6)
    part = build(nested(cls, "ListOffsetsPartition"), partition_index=0,
                 current_leader_epoch=-1, timestamp=-2)
    got = client.request(build(cls, replica_id=-1, isolation_level=0, topics=(
        build(nested(cls, "ListOffsetsTopic"), name=topic, partitions=(part,)),)))
    return ErrorCode(got.topics[0].partitions[0].error_code)


def test_only_api_versions_and_sasl_before_authenticating(daemon: Daemon) -> None:
    client = _client(daemon)
    try:
        versions = client.request(build(request_class(18, 3), client_software_name="t",
                                        client_software_version="1"))
        served = {a.api_key for a in versions.api_keys}
        assert {SASL_HANDSHAKE, SASL_AUTHENTICATE, DESCRIBE_ACLS} <= served
        refused = _handshake(client, "PLAIN")
        assert refused.error_code == ErrorCode.unsupported_sasl_mechanism
        assert set(refused.mechanisms) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
        with pytest.raises(ConnectionError):
            _metadata(client)
    finally:
        client.close()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_acls_on_fetch_list_offsets_and_metadata(daemon: Daemon, mechanism: str) -> None:
    client = _client(daemon)
    try:
        answer = login(client, "alice", PASSWORDS["alice"], mechanism)
        assert answer.error_code == ErrorCode.none
        assert answer.session_lifetime == datetime.timedelta(seconds=3)
        assert [t.name for t in _metadata(client).topics] == [TOPIC]
        assert _fetch_error(client, TOPIC) == ErrorCode.none
        assert _fetch_error(client, TXN_TOPIC) == ErrorCode.topic_authorization_failed
        assert _list_offsets_error(client, TOPIC) == ErrorCode.none
        assert _list_offsets_error(client, TXN_TOPIC) == ErrorCode.topic_authorization_failed
    finally:
        client.close()


def test_a_wrong_password_fails_and_closes(daemon: Daemon) -> None:
    client = _client(daemon)
    try:
        answer = login(client, "alice", "not it")
        assert answer.error_code == ErrorCode.sasl_authentication_failed
        assert "Authentication failed" in answer.error_message
        assert client.closed_by_server()
    finally:
        client.close()
    client = _client(daemon)
    try:
        assert _handshake(client, "SCRAM-SHA-512").error_code == ErrorCode.none
        scram = scramp.ScramClient(["SCRAM-SHA-512"], "mallory", "x")
        answer = _authenticate(client, scram.get_client_first().encode())
        assert answer.error_code == ErrorCode.sasl_authentication_failed
        assert client.closed_by_server()
    finally:
        client.close()


def test_handshake_v0_then_bare_tokens(daemon: Daemon) -> None:
    client = _client(daemon)
    try:
        assert _handshake(client, "SCRAM-SHA-256", version=0).error_code == ErrorCode.none
        scram = scramp.ScramClient(["SCRAM-SHA-256"], "alice", PASSWORDS["alice"])
        client.send_frame(scram.get_client_first().encode())
        scram.set_server_first(client.read_frame().decode())
        client.send_frame(scram.get_client_final().encode())
        scram.set_server_final(client.read_frame().decode())
        assert [t.name for t in _metadata(client).topics] == [TOPIC]
    finally:
        client.close()


def test_describe_acls_needs_the_cluster_and_create_acls_is_refused(daemon: Daemon) -> None:
    cls = request_class(DESCRIBE_ACLS, 3)
    every = build(cls, resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                  principal_filter=None, host_filter=None, operation=1, permission_type=1)
    client = _client(daemon)
    try:
        login(client, "alice", PASSWORDS["alice"])
        assert client.request(every).error_code == ErrorCode.cluster_authorization_failed
    finally:
        client.close()
    client = _client(daemon)
    try:
        login(client, "ops", PASSWORDS["ops"])
        got = client.request(every)
        assert got.error_code == ErrorCode.none
        shown = {(r.resource_type, r.resource_name, r.pattern_type, a.principal, a.operation,
                  a.permission_type) for r in got.resources for a in r.acls}
        assert shown == {(2, TOPIC, 3, "User:alice", 3, 3),
                         (4, "kafka-cluster", 3, "User:ops", 8, 3)}
        topics_only = client.request(build(cls, resource_type_filter=2, resource_name_filter=None,
                                           pattern_type_filter=1, principal_filter=None,
                                           host_filter=None, operation=1, permission_type=1))
        assert [r.resource_name for r in topics_only.resources] == [TOPIC]
        create = request_class(CREATE_ACLS, 3)
        creation = build(nested(create, "AclCreation"), resource_type=2, resource_name="x",
                         resource_pattern_type=3, principal="User:ops", host="*", operation=3,
                         permission_type=3)
        refused = client.request(build(create, creations=(creation,)))
        assert refused.results[0].error_code == ErrorCode.cluster_authorization_failed
        assert "tiered acl" in refused.results[0].error_message
    finally:
        client.close()


def test_sessions_end_unless_reauthenticated_as_the_same_principal(daemon: Daemon) -> None:
    client = _client(daemon)
    try:
        login(client, "alice", PASSWORDS["alice"])
        # re-authentication (KIP-368) on the same connection, as the same user, works
        assert login(client, "alice", PASSWORDS["alice"]).error_code == ErrorCode.none
        assert _metadata(client).topics
        # as another user it is refused and the connection closes
        assert login(client, "bob", PASSWORDS["bob"]).error_code == (
            ErrorCode.sasl_authentication_failed)
        assert client.closed_by_server()
    finally:
        client.close()
    client = _client(daemon)
    try:
        login(client, "alice", PASSWORDS["alice"])

        def expired() -> bool:
            try:
                _metadata(client)
            except (ConnectionError, OSError, struct.error):
                return True
            return False

        # the session lasts 3 s: once it has passed, a request closes the connection
        wait_until(expired, "the session to expire", timeout_s=30, interval_s=0.2)
    finally:
        client.close()
