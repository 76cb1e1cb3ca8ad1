"""The Kafka endpoint's network side: a listening socket (TLS with the stdlib `ssl` when
configured), one thread per connection, and the limits that keep one client from hurting the
others (docs/kafka-api.md, "Limits and security"), on the server base `tiered.app.serving`.

* Each connection has its own thread and answers its requests in order, as a broker does, so
  a client that is slow to send or to read, or a fetch waiting at the log end, holds only its
  own connection. A request must be whole within `request_timeout_ms` of its first byte, idle
  connections close after `idle_timeout_ms`, and a TLS handshake happens on the connection's
  thread.
* At most `max_connections` connections are served, `max_connections_per_ip` from one
  address; beyond `max_connections` the connection that waited on its client the longest is
  reclaimed (`tiered.app.serving`).
* A request frame larger than `max_request_bytes`, one that does not parse (a count or length
  that does not fit in the frame among them: frame_check), or an API or version that is not
  served closes that connection; nothing else is affected. It is logged at most once per
  client address per `BAD_REQUEST_LOG_S` (the rest at debug level, all counted).
  An ApiVersions request of an unknown version gets Kafka's UNSUPPORTED_VERSION answer instead.
* Fetch answers send the record bytes with `sendfile` on plain TCP.

`KafkaServer` binds in its constructor, so a busy port or unreadable certificate stops
`tiered run` before it starts anything; `start` begins serving with the daemon's reader and
`stop` closes every connection and waits for its thread before the reader is closed.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tiered.app.kafka_api.apis import API_VERSIONS, APIS, unsupported_api_versions
from tiered.app.kafka_api.auth import Guard
from tiered.app.kafka_api.catalog import Catalog
from tiered.app.kafka_api.context import Connection, FetchLimits, Node, Services
from tiered.app.kafka_api.coordinator import GroupSettings
from tiered.app.kafka_api.fetch import warm_up_in_background
from tiered.app.kafka_api.groups import GroupCoordinator, OffsetLimits
from tiered.app.kafka_api.ratelog import OncePerKey
from tiered.app.kafka_api.sasl import raw_token
from tiered.app.kafka_api.wire import (
    FRAME_SIZE,
    MalformedRequest,
    Reply,
    parse_request,
    peek_header,
)
from tiered.app.serving import Client, ConnectionServer, Limits, State
from tiered.errors import ConfigError, TieredError
from tiered.kafka.checkpoints import topic_id_to_str

if TYPE_CHECKING:
    from cache.reader import Reader
    from tiered.app.security_view import SecurityView
    from tiered.config.kafka import KafkaConfig
    from tiered.store.base import ObjectStore

__all__ = ["KafkaServer", "KafkaStats"]

log = logging.getLogger("tiered.app.kafka_api")

#: seconds the server waits, when it stops, for connection threads to finish their request
DRAIN_S = 10.0
#: at most one "closing the connection" line per client address per this many seconds
BAD_REQUEST_LOG_S = 60.0
#: the node id Metadata gives this endpoint (one node: it leads everything it serves)
NODE_ID = 0
_CLUSTER_NAMESPACE = uuid.UUID("0b8f7f7c-2f7e-4f3a-9a49-3c4f5d5b6a10")


@dataclass
class KafkaStats:
    """Counters for metrics; updated under the server's lock, the connection counts taken
    from the server base (`tiered.app.serving`) when read."""

    connections: int = 0
    #: connections mid-request (their first byte in, the rest not yet)
    connections_reading: int = 0
    connections_total: int = 0
    connections_refused: int = 0
    #: connections closed to make room for a new one at max_connections
    connections_reclaimed: int = 0
    #: connections closed because a request was not whole within request_timeout_ms
    closed_slow_requests: int = 0
    closed_bad_requests: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    bytes_sent: int = 0
    bytes_received: int = 0


class KafkaServer:
    """The read-only Kafka protocol endpoint of `tiered run`."""

    def __init__(self, config: KafkaConfig, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._ssl = _ssl_context(config) if config.tls else None
        limits = Limits(
            max_connections=config.max_connections,
            max_connections_per_ip=config.max_connections_per_ip,
            request_timeout_s=config.request_timeout_ms / 1000,
            idle_timeout_s=config.idle_timeout_ms / 1000, drain_s=DRAIN_S)
        try:
            self._server = ConnectionServer(
                "kafka", config.listen_host, config.listen_port, limits, self._serve,
                section="[kafka]", tls=self._ssl, log=log)
        except OSError as exc:
            where = _address(config.listen_host, config.listen_port)
            raise TieredError(f"cannot serve Kafka on {where}: {exc.strerror or exc}") from None
        self._lock = threading.Lock()
        self._stats = KafkaStats()
        self._bad_request_log = OncePerKey(BAD_REQUEST_LOG_S, clock=clock)
        self.services: Services | None = None
        self._guard = Guard.open()
        self._own_view: SecurityView | None = None

    @property
    def port(self) -> int:
        return self._server.address[1]

    @property
    def listen_address(self) -> str:
        return _address(self.config.listen_host, self.port)

    @property
    def advertised(self) -> tuple[str, int]:
        c = self.config
        if c.advertised_host is not None and c.advertised_port is not None:
            return c.advertised_host, c.advertised_port
        return c.listen_host, self.port

    def stats(self) -> dict[str, Any]:
        connections = self._server.stats()  # the server base counts connections
        with self._lock:
            s = dataclasses.replace(self._stats, requests=dict(self._stats.requests),
                                    **connections)
        return dataclasses.asdict(s)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, reader: Reader, bucket_url: str, *,
              prove_writes: Callable[[ObjectStore], object] | None = None,
              security: SecurityView | None = None) -> None:
        """Serve with `reader`; committed offsets go to the bucket through its store, once
        `prove_writes(store)` (the conditional-write probe) passed. `security`: the bucket's
        users and ACLs when clients authenticate (one is made on the reader's store when
        needed and not given)."""
        c = self.config
        self._guard = self._make_guard(reader, security)
        groups = GroupCoordinator(GroupSettings(
            initial_delay_s=c.group_initial_rebalance_delay_ms / 1000,
            min_session_timeout_s=c.group_min_session_timeout_ms / 1000,
            max_session_timeout_s=c.group_max_session_timeout_ms / 1000), reader.store,
            limits=OffsetLimits(
                metadata_max_chars=c.offset_metadata_max_bytes, max_groups=c.max_groups,
                max_offsets_per_group=c.max_offsets_per_group,
                retention_ms=c.offsets_retention_minutes * 60_000,
                check_interval_s=c.offsets_retention_check_interval_ms / 1000),
            prove_writes=prove_writes, clock=self._clock)
        host, port = self.advertised
        catalog = Catalog(reader, refresh_s=c.catalog_refresh_ms / 1000, clock=self._clock)
        self.services = Services(
            reader, catalog, groups, Node(NODE_ID, host, port),
            topic_id_to_str(uuid.uuid5(_CLUSTER_NAMESPACE, bucket_url)), clock=self._clock,
            fetch_limits=FetchLimits(c.fetch_max_bytes, c.max_partitions_per_fetch),
            guard=self._guard)
        catalog.start()
        groups.start()
        # kio's Fetch classes load on first use: now, not in a consumer's first Fetch
        fetch = APIS[1]
        warm_up_in_background(range(fetch.min_version, fetch.max_version + 1))
        self._server.start()
        log.info("Kafka endpoint on %s%s (advertised as %s:%d), read-only", self.listen_address,
                 " (TLS)" if self._ssl else "", host, port)

    def _make_guard(self, reader: Reader, view: SecurityView | None) -> Guard:
        """Who must authenticate and the ACLs (docs/security.md); open without security."""
        security = self.config.security
        if not security.authenticates:
            return Guard.open()
        if view is None:
            from tiered.app.authz import Policy
            from tiered.app.security_view import SecurityView

            view = self._own_view = SecurityView(reader.store, Policy(
                frozenset(security.super_users), security.allow_everyone_if_no_acl))
            view.start()
        return Guard(security, view, tls=self._ssl is not None)

    def stop(self) -> None:
        """Stop accepting, end every connection (requests in flight finish, waits end
        early) and wait up to `DRAIN_S` for their threads. Idempotent."""
        svc = self.services
        if svc is not None:
            svc.stopping.set()
            svc.groups.stop()
            svc.catalog.close()
        self._server.stop()
        if self._own_view is not None:
            self._own_view.stop()
            self._own_view = None

    # -- connections ---------------------------------------------------------------------

    def _serve(self, client: Client) -> None:
        svc = self.services
        assert svc is not None  # noqa: S101 - started by start()
        conn = Connection(client.id, client.peer_host)
        sock = client.sock
        try:
            svc.guard.on_connect(conn.auth, sock)
            while client.idle() and not svc.stopping.is_set():
                frame = self._read_frame(client)
                if frame is None:
                    break
                client.working()
                reply = self._answer(svc, conn, frame)
                try:
                    client.writing()
                    reply.send(sock)
                finally:
                    reply.close()
                with self._lock:
                    self._stats.bytes_sent += reply.size
                if conn.auth.closing:  # a failed authentication: answered, then closed
                    break
        except MalformedRequest as exc:
            self._bad_request(conn.peer_host, exc)
        finally:
            for session in conn.sessions:
                svc.reader.close_reader(session)

    def _bad_request(self, peer_host: str, exc: MalformedRequest) -> None:
        """Count a connection closed for a bad request; log it once per client per
        `BAD_REQUEST_LOG_S`, saying how many were held back since."""
        with self._lock:
            self._stats.closed_bad_requests += 1
        held = self._bad_request_log.admit(peer_host)
        if held is None:
            log.debug("kafka: closing the connection from %s: %s", peer_host, exc)
            return
        more = (f" ({held} more connection(s) from it closed for bad requests since the "
                "last line)" if held else "")
        log.warning("kafka: closing the connection from %s: %s%s", peer_host, exc, more)

    def _read_frame(self, client: Client) -> bytes | None:
        """The next request frame; None when the client closed, went idle or the server
        stops. `MalformedRequest` for a size outside 8..max_request_bytes. The request's
        deadline starts with its first byte (`Client.reading`)."""
        sock = client.sock
        try:
            head = _recv_exactly(sock, FRAME_SIZE.size, allow_eof=True, started=client.reading)
        except TimeoutError:
            if client.state is not State.IDLE:
                raise
            log.debug("kafka: closing an idle connection")
            return None
        if head is None:
            return None
        (size,) = FRAME_SIZE.unpack(head)
        if not 8 <= size <= self.config.max_request_bytes:
            raise MalformedRequest(
                f"request of {size} bytes; requests must be 8..{self.config.max_request_bytes} "
                "bytes ([kafka] max_request_bytes)")
        frame = _recv_exactly(sock, size, allow_eof=False)
        assert frame is not None  # noqa: S101 - allow_eof=False raises instead
        with self._lock:
            self._stats.bytes_received += size + FRAME_SIZE.size
        return frame

    def _answer(self, svc: Services, conn: Connection, frame: bytes) -> Reply:
        if conn.auth.raw_tokens:  # after SaslHandshake v0: a bare SASL token
            return raw_token(svc, conn, frame)
        key, version, correlation_id = peek_header(frame)
        api = APIS.get(key)
        if api is None:
            raise MalformedRequest(f"API key {key} is not served")
        if not api.min_version <= version <= api.max_version:
            if key == API_VERSIONS:
                return Reply([unsupported_api_versions(correlation_id)])
            raise MalformedRequest(f"{api.name} v{version} is not served (versions "
                                   f"{api.min_version}..{api.max_version})")
        svc.guard.admit(conn.auth, key)
        request = parse_request(frame)
        log.debug("kafka: %s v%d from %s (client %r)", api.name, version, conn.peer_host,
                  request.client_id)
        with self._lock:
            self._stats.requests[api.name] = self._stats.requests.get(api.name, 0) + 1
        return api.handler(svc, conn, request)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _recv_exactly(sock: socket.socket, n: int, *, allow_eof: bool,
                  started: Callable[[], None] | None = None) -> bytes | None:
    """`n` bytes; None at a clean EOF before any when `allow_eof`. `started()` runs once the
    first bytes are in."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        count = sock.recv_into(view[got:])
        if count == 0:
            if got == 0 and allow_eof:
                return None
            raise ConnectionError(f"the client closed the connection after {got} of {n} bytes")
        if got == 0 and started is not None:
            started()
        got += count
    return bytes(buf)


def _ssl_context(config: KafkaConfig) -> ssl.SSLContext:
    """A server context from the PEM files; `ConfigError` naming the key when they do not
    load."""
    assert config.tls_cert is not None and config.tls_key is not None  # noqa: S101
    for key, path in (("tls_cert", config.tls_cert), ("tls_key", config.tls_key)):
        if not path.is_file():
            raise ConfigError(f"[kafka] {key}: {path} does not exist or is not a file")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"[kafka] tls_cert / tls_key: cannot load {config.tls_cert} with "
                          f"{config.tls_key}: {exc}") from None
    if config.security.tls_client_ca is not None:
        require_client_certificates(context, config.security.tls_client_ca,
                                    "[kafka] tls_client_ca")
    return context


def require_client_certificates(context: ssl.SSLContext, ca: Path, key: str) -> None:
    """Mutual TLS: the handshake fails without a client certificate signed by `ca`."""
    try:
        context.load_verify_locations(cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{key}: cannot load {ca}: {exc}") from None
    context.verify_mode = ssl.CERT_REQUIRED
