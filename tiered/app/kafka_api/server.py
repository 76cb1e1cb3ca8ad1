"""The Kafka endpoint's network side: a listening socket (TLS with the stdlib `ssl` when
configured), one thread per connection, and the limits that keep one client from hurting the
others (docs/kafka-api.md, "Limits and security").

* Each connection has its own thread and answers its requests in order, as a broker does, so
  a client that is slow to send or to read, or a fetch waiting at the log end, holds only its
  own connection. Socket reads and writes time out (`IO_TIMEOUT_S`), idle connections close
  after `idle_timeout_ms`, and a TLS handshake happens on the connection's thread.
* At most `max_connections` connections are served; one more is accepted and closed at once,
  with a log line (at most one per `REFUSAL_LOG_S`).
* A request frame larger than `max_request_bytes`, one that does not parse, or an API or
  version that is not served closes that connection with a log line; nothing else is affected.
  An ApiVersions request of an unknown version gets Kafka's UNSUPPORTED_VERSION answer instead.
* Fetch answers send the record bytes with `sendfile` on plain TCP.

`KafkaServer` binds in its constructor, so a busy port or unreadable certificate stops
`tiered run` before it starts anything; `start` begins serving with the daemon's reader and
`stop` closes every connection and waits for its thread before the reader is closed.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tiered.app.kafka_api.apis import API_VERSIONS, APIS, unsupported_api_versions
from tiered.app.kafka_api.catalog import Catalog
from tiered.app.kafka_api.context import Connection, Node, Services
from tiered.app.kafka_api.coordinator import GroupSettings
from tiered.app.kafka_api.groups import GroupCoordinator
from tiered.app.kafka_api.wire import (
    FRAME_SIZE,
    MalformedRequest,
    Reply,
    parse_request,
    peek_header,
)
from tiered.errors import ConfigError, TieredError
from tiered.kafka.checkpoints import topic_id_to_str

if TYPE_CHECKING:
    from cache.reader import Reader
    from tiered.config.kafka import KafkaConfig
    from tiered.store.base import ObjectStore

__all__ = ["KafkaServer", "KafkaStats"]

log = logging.getLogger("tiered.app.kafka_api")

#: seconds a socket read inside a request, or a write of an answer, may stall
IO_TIMEOUT_S = 60.0
#: seconds the server waits, when it stops, for connection threads to finish their request
DRAIN_S = 10.0
#: at most one "too many connections" line per this many seconds
REFUSAL_LOG_S = 10.0
#: the node id Metadata gives this endpoint (one node: it leads everything it serves)
NODE_ID = 0
_CLUSTER_NAMESPACE = uuid.UUID("0b8f7f7c-2f7e-4f3a-9a49-3c4f5d5b6a10")


@dataclass
class KafkaStats:
    """Counters for metrics; updated under the server's lock."""

    connections: int = 0
    connections_total: int = 0
    connections_refused: int = 0
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
        try:
            self._sock = socket.create_server(
                (config.listen_host, config.listen_port),
                family=socket.AF_INET6 if ":" in config.listen_host else socket.AF_INET,
                backlog=128)
        except OSError as exc:
            where = _address(config.listen_host, config.listen_port)
            raise TieredError(f"cannot serve Kafka on {where}: {exc.strerror or exc}") from None
        self._sock.settimeout(0.5)  # the accept loop looks at the stop flag this often
        self._lock = threading.Lock()
        self._stats = KafkaStats()
        self._conns: dict[int, socket.socket] = {}
        self._threads: dict[int, threading.Thread] = {}
        self._ids = itertools.count(1)
        self._accepting: threading.Thread | None = None
        self._refusal_logged = 0.0
        self.services: Services | None = None

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

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
        with self._lock:
            s = self._stats
            return {"connections": s.connections, "connections_total": s.connections_total,
                    "connections_refused": s.connections_refused,
                    "closed_bad_requests": s.closed_bad_requests,
                    "requests": dict(s.requests), "bytes_sent": s.bytes_sent,
                    "bytes_received": s.bytes_received}

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, reader: Reader, bucket_url: str, *,
              prove_writes: Callable[[ObjectStore], object] | None = None) -> None:
        """Serve with `reader`; committed offsets go to the bucket through its store, once
        `prove_writes(store)` (the conditional-write probe) passed."""
        c = self.config
        groups = GroupCoordinator(GroupSettings(
            initial_delay_s=c.group_initial_rebalance_delay_ms / 1000,
            min_session_timeout_s=c.group_min_session_timeout_ms / 1000,
            max_session_timeout_s=c.group_max_session_timeout_ms / 1000), reader.store,
            prove_writes=prove_writes, clock=self._clock)
        host, port = self.advertised
        catalog = Catalog(reader, refresh_s=c.catalog_refresh_ms / 1000, clock=self._clock)
        self.services = Services(
            reader, catalog, groups, Node(NODE_ID, host, port),
            topic_id_to_str(uuid.uuid5(_CLUSTER_NAMESPACE, bucket_url)), clock=self._clock)
        catalog.start()
        groups.start()
        self._accepting = threading.Thread(target=self._accept_loop, name="tiered-kafka",
                                           daemon=True)
        self._accepting.start()
        log.info("Kafka endpoint on %s%s (advertised as %s:%d), read-only", self.listen_address,
                 " (TLS)" if self._ssl else "", host, port)

    def stop(self) -> None:
        """Stop accepting, end every connection (requests in flight finish, waits end
        early) and wait up to `DRAIN_S` for their threads. Idempotent."""
        svc = self.services
        if svc is not None:
            svc.stopping.set()
            svc.groups.stop()
            svc.catalog.close()
        if self._accepting is not None:
            self._accepting.join()
            self._accepting = None
        with self._lock:
            conns = list(self._conns.values())
            threads = list(self._threads.values())
        for sock in conns:  # wakes threads waiting for a request; one mid-request finishes it
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RD)
        deadline = time.monotonic() + DRAIN_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        left = [t for t in threads if t.is_alive()]
        if left:
            # a client that stopped reading holds its thread in a write: cut it off
            log.warning("kafka: %d connection(s) still busy after %.0f s; closing them",
                        len(left), DRAIN_S)
            with self._lock:
                conns = list(self._conns.values())
            for sock in conns:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            for thread in left:
                thread.join(1.0)
        self._sock.close()

    # -- connections ---------------------------------------------------------------------

    def _accept_loop(self) -> None:
        svc = self.services
        assert svc is not None  # noqa: S101 - started by start()
        while not svc.stopping.is_set():
            try:
                sock, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if svc.stopping.is_set():
                    return
                log.warning("kafka: accept failed: %s", exc)
                time.sleep(0.1)
                continue
            conn_id = next(self._ids)
            with self._lock:
                full = len(self._conns) >= self.config.max_connections
                if full:
                    self._stats.connections_refused += 1
                else:
                    self._conns[conn_id] = sock
                    self._stats.connections += 1
                    self._stats.connections_total += 1
            if full:
                self._refuse(sock, peer)
                continue
            thread = threading.Thread(target=self._serve, args=(conn_id, sock, peer),
                                      name=f"tiered-kafka-{conn_id}", daemon=True)
            with self._lock:
                self._threads[conn_id] = thread
            thread.start()

    def _refuse(self, sock: socket.socket, peer: Any) -> None:
        with contextlib.suppress(OSError):
            sock.close()
        now = time.monotonic()
        if now - self._refusal_logged >= REFUSAL_LOG_S:
            self._refusal_logged = now
            log.warning("kafka: closed a connection from %s: already serving max_connections "
                        "= %d ([kafka] max_connections)", peer[0], self.config.max_connections)

    def _serve(self, conn_id: int, sock: socket.socket, peer: Any) -> None:
        svc = self.services
        assert svc is not None  # noqa: S101 - started by start()
        conn = Connection(conn_id, str(peer[0]))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock.settimeout(IO_TIMEOUT_S)
                sock = self._ssl.wrap_socket(sock, server_side=True)
                with self._lock:
                    self._conns[conn_id] = sock
            while not svc.stopping.is_set():
                frame = self._read_frame(sock)
                if frame is None:
                    break
                reply = self._answer(svc, conn, frame)
                try:
                    sock.settimeout(IO_TIMEOUT_S)
                    reply.send(sock)
                finally:
                    reply.close()
                with self._lock:
                    self._stats.bytes_sent += reply.size
        except MalformedRequest as exc:
            with self._lock:
                self._stats.closed_bad_requests += 1
            log.warning("kafka: closing the connection from %s: %s", conn.peer_host, exc)
        except (OSError, ssl.SSLError) as exc:  # resets, timeouts, TLS failures: theirs alone
            log.debug("kafka: connection from %s ended: %s", conn.peer_host, exc)
        except Exception:
            log.exception("kafka: closing the connection from %s after an internal error",
                          conn.peer_host)
        finally:
            for session in conn.sessions:
                svc.reader.close_reader(session)
            with contextlib.suppress(OSError):
                sock.close()
            with self._lock:
                self._conns.pop(conn_id, None)
                self._threads.pop(conn_id, None)
                self._stats.connections -= 1

    def _read_frame(self, sock: socket.socket) -> bytes | None:
        """The next request frame; None when the client closed, went idle or the server
        stops. `MalformedRequest` for a size outside 8..max_request_bytes."""
        sock.settimeout(self.config.idle_timeout_ms / 1000)
        try:
            head = _recv_exactly(sock, FRAME_SIZE.size, allow_eof=True)
        except TimeoutError:
            log.debug("kafka: closing an idle connection")
            return None
        if head is None:
            return None
        (size,) = FRAME_SIZE.unpack(head)
        if not 8 <= size <= self.config.max_request_bytes:
            raise MalformedRequest(
                f"request of {size} bytes; requests must be 8..{self.config.max_request_bytes} "
                "bytes ([kafka] max_request_bytes)")
        sock.settimeout(IO_TIMEOUT_S)
        frame = _recv_exactly(sock, size, allow_eof=False)
        assert frame is not None  # noqa: S101 - allow_eof=False raises instead
        with self._lock:
            self._stats.bytes_received += size + FRAME_SIZE.size
        return frame

    def _answer(self, svc: Services, conn: Connection, frame: bytes) -> Reply:
        key, version, correlation_id = peek_header(frame)
        api = APIS.get(key)
        if api is None:
            raise MalformedRequest(f"API key {key} is not served")
        if not api.min_version <= version <= api.max_version:
            if key == API_VERSIONS:
                return Reply([unsupported_api_versions(correlation_id)])
            raise MalformedRequest(f"{api.name} v{version} is not served (versions "
                                   f"{api.min_version}..{api.max_version})")
        request = parse_request(frame)
        log.debug("kafka: %s v%d from %s (client %r)", api.name, version, conn.peer_host,
                  request.client_id)
        with self._lock:
            self._stats.requests[api.name] = self._stats.requests.get(api.name, 0) + 1
        return api.handler(svc, conn, request)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _recv_exactly(sock: socket.socket, n: int, *, allow_eof: bool) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        count = sock.recv_into(view[got:])
        if count == 0:
            if got == 0 and allow_eof:
                return None
            raise ConnectionError(f"the client closed the connection after {got} of {n} bytes")
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
    return context
