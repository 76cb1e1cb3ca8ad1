"""The daemon's HTTP server: `/metrics` (Prometheus text), `/health` and routed paths such as
the remote-read API under `/v1/`.

Each connection runs on its own thread of the server base `tiered.app.serving`, under its
limits (`[http]`, docs/remote-read.md "HTTP endpoint"): a request's line and headers must be
in within `request_timeout_ms` of its first byte, so a slowloris client holds only its own
slot, and not for long. A request only calls the source functions and routes the server was
given; those must be safe to call from many threads at once (the daemon hands in functions
that read an immutable, already-published snapshot, and the thread-safe `Reader`).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, cast
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from cache.fetched_bytes import Pieces
from tiered.app.health import Health
from tiered.app.serving import Client, ConnectionServer, Limits

__all__ = ["HttpServer", "Response", "Route"]

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


@dataclass(frozen=True)
class _Sources:
    """What requests answer from: the metrics registry, the health source and the routes."""

    registry: CollectorRegistry
    health: Callable[[], Health]
    routes: Mapping[str, Route]
    #: [http] auth's check of each request (docs/security.md); None: open
    guard: Guard | None = None


class _Handler(BaseHTTPRequestHandler):
    """One connection's requests, in turn (keep-alive), on the connection's own thread."""

    #: keep-alive: a consumer polling for records reuses its connection instead of paying a
    #: TCP handshake per fetch (every answer carries a Content-Length)
    protocol_version = "HTTP/1.1"
    #: socket timeouts follow the connection's state (`tiered.app.serving`), not one value
    timeout = None
    #: the status line and headers `send_response` / `send_header` gathered (http.server's)
    _headers_buffer: list[bytes]

    def __init__(self, client: Client, sources: _Sources) -> None:
        self.client = client
        self.sources = sources
        # http.server's "server" argument is only passed through; this one has no other
        super().__init__(client.sock, client.peer, None)  # type: ignore[arg-type]

    def handle(self) -> None:
        """Requests until the client or the server ends the connection. A request's deadline
        starts with its first byte, seen (`peek`) before http.server reads its line."""
        while self.client.idle():
            try:
                if not cast("io.BufferedReader", self.rfile).peek(1):
                    return  # the client closed, or the server cut the connection
            except TimeoutError:
                return  # idle for idle_timeout_ms
            self.client.reading()
            self.close_connection = True
            self.handle_one_request()
            if self.close_connection:
                return

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
        self.client.working()
        path, _, query = self.path.partition("?")
        try:
            status, headers, body = self._answer(method, path, query)
        except Exception:  # a scrape or a read must never take the server down
            log.exception("error serving %s %s", method, path)
            status, headers, body = (HTTPStatus.INTERNAL_SERVER_ERROR,
                                     {"Content-Type": _TEXT}, b"internal error\n")
        try:
            self.client.writing()
            self._send(method, status, headers, body)
        except (TimeoutError, ConnectionError) as exc:
            log.debug("client went away during %s %s: %s", method, path, exc)

    def _answer(self, method: str, path: str, query: str) -> Response:
        guard = self.sources.guard
        if guard is not None:  # [http] auth (docs/security.md)
            refused = guard(path, self.headers.get("Authorization"), self.client.peer_host)
            if refused is not None:
                return refused
        for prefix, route in self.sources.routes.items():
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
            return HTTPStatus.OK, {"Content-Type": content_type}, encoder(self.sources.registry)
        health = self.sources.health()
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


def _serve(client: Client, sources: _Sources) -> None:
    """One connection (`ConnectionServer` calls it on the connection's thread)."""
    _Handler(client, sources)


class HttpServer:
    """`/metrics` (Prometheus text, or OpenMetrics when asked for), `/health`, and `routes`
    (path prefix -> `Route`, tried first, in order) on one port, under `limits` ([http]).

    `port=0` binds an ephemeral port; `port` then tells which; binding fails with OSError.
    Serves from background threads between `start()` and `stop()`; usable as a context
    manager. `stop()` lets requests in flight finish for up to `drain_s` seconds, so whatever
    a route uses (the daemon's reader) can be closed right after it."""

    def __init__(
        self, host: str, port: int, registry: CollectorRegistry, health: Callable[[], Health],
        routes: Mapping[str, Route] | None = None, *, limits: Limits | None = None,
        drain_s: float = 10.0, ssl_context: ssl.SSLContext | None = None,
        guard: Guard | None = None,
    ) -> None:
        limits = limits or Limits(idle_timeout_s=60.0)
        sources = _Sources(registry, health, dict(routes or {}), guard)
        self._tls = ssl_context is not None
        self._server = ConnectionServer(
            "http", host, port, dataclasses.replace(limits, drain_s=drain_s),
            lambda client: _serve(client, sources), section="[http]", tls=ssl_context,
            log=log)

    @property
    def host(self) -> str:
        return self._server.address[0]

    @property
    def port(self) -> int:
        return self._server.address[1]

    @property
    def url(self) -> str:
        host = self.host
        scheme = "https" if self._tls else "http"
        return f"{scheme}://[{host}]:{self.port}" if ":" in host else f"{scheme}://{host}:{self.port}"

    def stats(self) -> dict[str, int]:
        """The server base's connection counts (`ConnectionServer.stats`)."""
        return self._server.stats()

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        """Stop accepting, drain requests in flight, close every socket. Idempotent."""
        self._server.stop()

    def __enter__(self) -> HttpServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
