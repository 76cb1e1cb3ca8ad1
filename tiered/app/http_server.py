"""The daemon's small HTTP server: `/metrics` (Prometheus text), `/health` and routed paths
such as the remote-read API under `/v1/`.

Each request runs on its own daemon thread and only calls the source functions and routes it
was given; those must be safe to call from many threads at once (the daemon hands in
functions that read an immutable, already-published snapshot, and the thread-safe `Reader`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from cache.pieces import Pieces
from tiered.app.health import Health

__all__ = ["MetricsServer", "Response", "Route"]

log = logging.getLogger(__name__)


#: a routed path's answer: (status, headers, body); a HEAD answer carries the GET's
#: Content-Length in `headers` and an empty body
Response = tuple[int, Mapping[str, str], bytes | Pieces]
#: `route(method, path, query)`: `path` still percent-encoded and without the query string,
#: `query` as `urllib.parse.parse_qs` returns it (blank values kept)
Route = Callable[[str, str, Mapping[str, Sequence[str]]], Response]
#: `guard(path, authorization header, peer_host)`: None to serve the request, else the
#: refusal to send
Guard = Callable[[str, str | None, str], Response | None]

_TEXT = "text/plain; charset=utf-8"
#: the last Date header formatted: (Unix second, text)
_date: tuple[int, str] = (0, "")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    #: keep-alive: a consumer polling for records reuses its connection instead of paying a
    #: TCP handshake per fetch (every answer carries a Content-Length)
    protocol_version = "HTTP/1.1"
    #: small answers go out at once instead of waiting on the client's delayed ACK
    disable_nagle_algorithm = True
    #: seconds a socket read or write may stall before the request is dropped, so a client
    #: that stops reading cannot hold a request thread (and the daemon's shutdown) for ever
    timeout = 60.0
    #: the status line and headers `send_response` / `send_header` gathered (http.server's)
    _headers_buffer: list[bytes]

    # http.server calls do_<METHOD>; any other method gets its own 501
    def do_GET(self) -> None:  # noqa: N802
        self._dispatch("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        with self.server.request():
            self._dispatch_one(method)
        if self.server.stopping:
            self.close_connection = True  # no keep-alive past a shutdown

    def _dispatch_one(self, method: str) -> None:
        path, _, query = self.path.partition("?")
        try:
            status, headers, body = self._answer(method, path, query)
        except Exception:  # a scrape or a read must never take the server down
            log.exception("error serving %s %s", method, path)
            status, headers, body = (HTTPStatus.INTERNAL_SERVER_ERROR,
                                     {"Content-Type": _TEXT}, b"internal error\n")
        try:
            self._send(method, status, headers, body)
        except (TimeoutError, ConnectionError) as exc:
            log.debug("client went away during %s %s: %s", method, path, exc)

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):  # TLS: the handshake on this thread
            self.connection.do_handshake()

    def _answer(self, method: str, path: str, query: str) -> Response:
        guard = self.server.guard
        if guard is not None:  # [http] auth (docs/security.md)
            refused = guard(path, self.headers.get("Authorization"), str(self.client_address[0]))
            if refused is not None:
                return refused
        for prefix, route in self.server.routes.items():
            if path.startswith(prefix):
                return route(method, path, parse_qs(query, keep_blank_values=True))
        if path not in ("/metrics", "/health"):
            return (HTTPStatus.NOT_FOUND, {"Content-Type": _TEXT},
                    b"not found: try /metrics or /health\n")
        if method not in ("GET", "HEAD"):
            return (HTTPStatus.METHOD_NOT_ALLOWED, {"Content-Type": _TEXT, "Allow": "GET, HEAD"},
                    f"method {method} not allowed\n".encode())
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            return HTTPStatus.OK, {"Content-Type": content_type}, encoder(self.server.registry)
        health = self.server.health()
        body = json.dumps(health.body, default=str).encode() + b"\n"
        return health.status, {"Content-Type": "application/json"}, body

    def _send(self, method: str, status: int, headers: Mapping[str, str],
              body: bytes | Pieces) -> None:
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if not any(name.lower() == "content-length" for name in headers):
                size = body.size if isinstance(body, Pieces) else len(body)
                self.send_header("Content-Length", str(size))
            # the headers go out with the body's first bytes, not flushed on their own as
            # `end_headers` would: over loopback each send wakes the client (`Pieces.send`)
            self._headers_buffer.append(b"\r\n")
            head = b"".join(self._headers_buffer)
            self._headers_buffer = []
            if method == "HEAD":
                self.wfile.write(head)
            elif isinstance(body, Pieces):
                body.send(self.connection, head=head)
            else:
                self.wfile.write(head + body)
        finally:
            if isinstance(body, Pieces):
                body.close()

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The Date header, formatted once a second rather than for every answer."""
        if timestamp is not None:
            return super().date_time_string(timestamp)
        global _date  # noqa: PLW0603 - a (second, text) pair swapped whole
        now = int(time.time())
        second, text = _date
        if second != now:
            text = super().date_time_string(now)
            _date = (now, text)
        return text

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        log.debug("http: " + format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a request stuck past the drain must not keep the process alive

    def __init__(
        self, address: tuple[str, int], registry: CollectorRegistry, health: Callable[[], Health],
        routes: Mapping[str, Route], *, ssl_context: ssl.SSLContext | None = None,
        guard: Guard | None = None,
    ) -> None:
        self.registry = registry
        self.health = health
        self.routes = routes
        self.guard = guard
        self._inflight = 0
        self.stopping = False
        self._idle = threading.Condition()
        super().__init__(address, _Handler)
        if ssl_context is not None:
            self.socket = ssl_context.wrap_socket(self.socket, server_side=True,
                                                  do_handshake_on_connect=False)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A failed TLS handshake or a reset is the client's affair: logged, no traceback."""
        log.debug("http: request from %s failed", client_address[0], exc_info=True)

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Counts a request in flight (an idle keep-alive connection is not one)."""
        with self._idle:
            self._inflight += 1
        try:
            yield
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def drain(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for requests in flight to finish; returns how many remain."""
        self.stopping = True
        with self._idle:
            self._idle.wait_for(lambda: self._inflight == 0, timeout_s)
            return self._inflight


class MetricsServer:
    """`/metrics` (Prometheus text, or OpenMetrics when asked for), `/health`, and `routes`
    (path prefix -> `Route`, tried first, in order) on one port.

    `port=0` binds an ephemeral port; `port` then tells which. Serves from a background thread
    between `start()` and `stop()`; usable as a context manager. `stop()` lets requests in
    flight finish for up to `drain_s` seconds, so whatever a route uses (the daemon's reader)
    can be closed right after it."""

    def __init__(
        self, host: str, port: int, registry: CollectorRegistry, health: Callable[[], Health],
        routes: Mapping[str, Route] | None = None, *, drain_s: float = 10.0,
        ssl_context: ssl.SSLContext | None = None, guard: Guard | None = None,
    ) -> None:
        self._server = _Server((host, port), registry, health, dict(routes or {}),
                               ssl_context=ssl_context, guard=guard)
        self._tls = ssl_context is not None
        self._drain_s = drain_s
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"{'https' if self._tls else 'http'}://{self.host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="tiered-metrics", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting, drain requests in flight, close the socket. Idempotent."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
            left = self._server.drain(self._drain_s)
            if left:
                log.warning("http: %d request(s) still running after %.0f s; closing anyway",
                            left, self._drain_s)
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
