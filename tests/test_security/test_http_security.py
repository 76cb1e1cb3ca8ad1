"""The HTTP API with `[http] auth = "basic"` over TLS: /health stays open, the records API
needs a user with READ on the topic, /metrics one with DESCRIBE on the cluster; refusals are
401 (with WWW-Authenticate) and 403 with a JSON body; `tls_client_ca` requires a client
certificate."""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from support.certs import Authority
from support.daemons import running
from support.kafka_endpoint import TOPIC, TXN_TOPIC, History

from manifests.security import Acl, User, add_acl, make_credential, put_user
from tiered.app.daemon import Daemon
from tiered.config import parse_config
from tiered.errors import ConfigError
from tiered.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PASSWORDS: dict[str, str] = {}


def _config(history: History, http: dict[str, Any], cache: str, *, dirs: bool = True) -> Any:
    """A daemon serving the history over HTTP; `dirs=False`: a history server (the bucket
    alone), so it can run beside another daemon archiving the same log."""
    data = {"storage": history.storage,
            "log": {"dirs": [str(history.log_dir)] if dirs else []},
            "cache": {"dir": str(history.base / cache)}, "http": http,
            # as the Kafka-endpoint tests: history older than any retention stays
            "cluster": {"storage_min_free_bytes": 0, "cloud_storage_cache_chunk_size": 8192,
                        "log_retention_ms": -1}}
    return parse_config(data, source="test", base_dir=history.base)


@pytest.fixture(scope="module")
def server(history: History, authority: Authority) -> Any:
    with open_store(history.config().store_settings()) as store:
        for name in ("alice", "ops"):
            PASSWORDS[name] = secrets.token_urlsafe(12)
            put_user(store, User(name, {"SCRAM-SHA-512": make_credential(PASSWORDS[name],
                                                                          "SCRAM-SHA-512")}))
        add_acl(store, Acl("User:alice", "topic", "literal", TOPIC, "read",  # type: ignore[arg-type]
                           "allow"))
        add_acl(store, Acl("User:ops", "cluster", "literal", "kafka-cluster",  # type: ignore[arg-type]
                           "describe", "allow"))
    return authority.issue("http-server", cn="127.0.0.1", server=True)


@pytest.fixture(scope="module")
def daemon(history: History, server: Any) -> Iterator[Daemon]:
    config = _config(history, {"auth": "basic", "tls_cert": str(server.cert),
                               "tls_key": str(server.key)}, "cache-http")
    with running(config) as d:
        yield d


def _get(daemon: Daemon, path: str, authority: Authority, user: str | None = None,
         password: str | None = None, cert: Any = None) -> tuple[int, dict[str, str], bytes]:
    context = ssl.create_default_context(cafile=str(authority.ca))
    if cert is not None:
        context.load_cert_chain(cert.cert, cert.key)
    request = urllib.request.Request(daemon.server.url + path)
    if user is not None:
        token = base64.b64encode(f"{user}:{password or PASSWORDS[user]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def _records(topic: str) -> str:
    return f"/v1/topics/{topic}/partitions/1/records?offset=0&max_bytes=4096" if topic == TOPIC \
        else f"/v1/topics/{topic}/partitions/0/records?offset=0&max_bytes=4096"


def test_health_stays_open(daemon: Daemon, authority: Authority) -> None:
    assert daemon.server.url.startswith("https://")
    status, _, body = _get(daemon, "/health", authority)
    assert status == 200 and json.loads(body)


def test_records_need_credentials_and_read_on_the_topic(history: History, daemon: Daemon,
                                                        authority: Authority) -> None:
    status, headers, body = _get(daemon, _records(TOPIC), authority)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert json.loads(body)["error"] == "UNAUTHENTICATED"
    assert _get(daemon, _records(TOPIC), authority, "alice", "wrong")[0] == 401
    assert _get(daemon, _records(TOPIC), authority, "mallory", "x")[0] == 401
    status, _, body = _get(daemon, _records(TOPIC), authority, "alice")
    assert status == 200 and body == history.expected_bytes(TOPIC, 1, 0, 4096)
    status, _, body = _get(daemon, _records(TXN_TOPIC), authority, "alice")
    assert status == 403 and json.loads(body)["error"] == "TOPIC_AUTHORIZATION_FAILED"
    # a second request of the same client is served from the remembered check, same answer
    assert _get(daemon, _records(TOPIC), authority, "alice")[0] == 200


def test_metrics_need_describe_on_the_cluster(daemon: Daemon, authority: Authority) -> None:
    assert _get(daemon, "/metrics", authority)[0] == 401
    status, _, body = _get(daemon, "/metrics", authority, "alice")
    assert status == 403 and json.loads(body)["error"] == "CLUSTER_AUTHORIZATION_FAILED"
    status, _, body = _get(daemon, "/metrics", authority, "ops")
    assert status == 200 and b"tiered_" in body


def test_mutual_tls_requires_a_client_certificate(history: History, server: Any,
                                                  authority: Authority) -> None:
    config = _config(history, {"auth": "basic", "tls_cert": str(server.cert),
                               "tls_key": str(server.key), "tls_client_ca": str(authority.ca)},
                     "cache-http-mtls", dirs=False)
    client = authority.issue("http-client", cn="alice")
    with running(config) as daemon:
        status, _, body = _get(daemon, _records(TOPIC), authority, "alice", cert=client)
        assert status == 200 and body, body
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            _get(daemon, _records(TOPIC), authority, "alice")


def test_unloadable_certificate_files_name_the_key(history: History, tmp_path: Any) -> None:
    (tmp_path / "bad.pem").write_text("not a certificate")
    config = _config(history, {"auth": "basic", "tls_cert": str(tmp_path / "bad.pem"),
                               "tls_key": str(tmp_path / "bad.pem")}, "cache-http-bad")
    with pytest.raises(ConfigError, match=r"\[http\] tls_cert"):
        Daemon(config)
