"""A scriptable HTTP proxy on 127.0.0.1 that sits between boto3 and moto's S3 server.

Requests are forwarded unchanged (method, path, query, Host and every signed header, body) so
SigV4-signed requests reach moto as boto3 sent them. Tests script faults for the next N matching
requests -- an S3 XML error with a chosen status and code, or a connection closed without an
answer -- and read back every request the proxy saw, to count attempts.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: fault name -> (HTTP status, S3 error code, message); `drop` closes the connection instead
FAULTS: dict[str, tuple[int, str, str]] = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
    "denied": (403, "AccessDenied", "Access Denied"),
    "notfound": (404, "NoSuchKey", "The specified key does not exist."),
    "notimplemented": (501, "NotImplemented", "A header you provided is not implemented."),
    "conflict": (409, "ConditionalRequestConflict", "A conflicting operation is in progress."),
}
DROP = "drop"
#: forward the request (the store applies it), then close the connection without an answer:
#: what a client sees when the network fails after the server acted
DROP_AFTER = "drop_after"

#: headers that belong to one hop, not to the request; never forwarded
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
    }
)


@dataclass(frozen=True)
class Seen:
    """One request as the proxy received it."""

    method: str
    path: str  # without the query
    query: str
    headers: dict[str, str]
    faulted: str | None  # the fault served instead of forwarding, if any
    size: int = 0  # bytes of the request body


@dataclass
class _Script:
    kind: str
    remaining: int
    method: str | None
    path_contains: str | None
    query_contains: str | None
    header: str | None
    #: matching requests still to let through before the fault applies
    skip: int = 0

    def matches(self, method: str, path: str, query: str, headers: dict[str, str]) -> bool:
        return (
            (self.method is None or method == self.method)
            and (self.path_contains is None or self.path_contains in path)
            and (self.query_contains is None or self.query_contains in query)
            and (self.header is None or self.header.lower() in headers)
        )


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-answer (a killed process, a dropped connection) is part of
    the scenarios here, not an error to print."""

    def handle_error(self, request: object, client_address: object) -> None:
        pass


class FaultProxy:
    """Start with `start()` (or as a context manager); point boto3's endpoint at `url`."""

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream_host = parsed.hostname or "127.0.0.1"
        self.upstream_port = parsed.port or 80
        self._lock = threading.Lock()
        self._scripts: list[_Script] = []
        self._seen: list[Seen] = []
        #: requests matching one of these wait before they are forwarded (`hold`)
        self._holds: list[_Script] = []
        self._released = threading.Event()
        self._waiting = 0
        #: random faults: (probability per request, kinds to draw from, generator)
        self._chaos: tuple[float, tuple[str, ...], random.Random] | None = None
        self.faults_by_kind: dict[str, int] = {}
        #: keep `seen()` from growing without bound in long runs
        self.record = True
        self._server = _QuietServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- scripting -------------------------------------------------------------------------

    def inject(
        self,
        kind: str,
        times: int = 1,
        *,
        method: str | None = None,
        path_contains: str | None = None,
        query_contains: str | None = None,
        header: str | None = None,
        skip: int = 0,
    ) -> None:
        """Serve fault `kind` (a `FAULTS` name, `DROP` or `DROP_AFTER`) to the next `times`
        requests that match every given filter (method, substring of path or query, presence
        of a header), after letting the first `skip` of them through."""
        if kind not in (DROP, DROP_AFTER) and kind not in FAULTS:
            raise ValueError(
                f"unknown fault {kind!r}; known: {sorted(FAULTS)}, {DROP!r} and {DROP_AFTER!r}")
        with self._lock:
            self._scripts.append(
                _Script(kind, times, method, path_contains, query_contains, header, skip)
            )

    def chaos(self, rate: float, kinds: tuple[str, ...], seed: int) -> None:
        """From now on serve a fault drawn from `kinds` to each request with probability
        `rate` (scripted faults still come first), from a generator seeded with `seed`."""
        for kind in kinds:
            if kind not in (DROP, DROP_AFTER) and kind not in FAULTS:
                raise ValueError(f"unknown fault {kind!r}")
        with self._lock:
            self._chaos = (rate, tuple(kinds), random.Random(seed))

    def hold(self, *, method: str | None = None, path_contains: str | None = None,
             query_contains: str | None = None) -> None:
        """Keep every request matching the filters waiting, before it is forwarded, until
        `release_held` (a request the store has not seen yet: an upload in flight)."""
        with self._lock:
            self._released.clear()
            self._holds.append(_Script("hold", 1 << 30, method, path_contains, query_contains,
                                       None))

    @property
    def waiting(self) -> int:
        """Requests held right now."""
        with self._lock:
            return self._waiting

    def release_held(self) -> None:
        """Forward the held requests and hold no more."""
        with self._lock:
            self._holds.clear()
        self._released.set()

    def _wait_if_held(self, method: str, path: str, query: str, headers: dict[str, str]
                      ) -> None:
        with self._lock:
            if not any(h.matches(method, path, query, headers) for h in self._holds):
                return
            self._waiting += 1
        try:
            self._released.wait(timeout=600)
        finally:
            with self._lock:
                self._waiting -= 1

    def calm(self) -> None:
        """Stop random faults."""
        with self._lock:
            self._chaos = None

    def seen(
        self,
        *,
        method: str | None = None,
        path_contains: str | None = None,
        query_contains: str | None = None,
    ) -> list[Seen]:
        """Requests received so far (faulted ones included), optionally filtered."""
        with self._lock:
            return [
                s
                for s in self._seen
                if (method is None or s.method == method)
                and (path_contains is None or path_contains in s.path)
                and (query_contains is None or query_contains in s.query)
            ]

    def reset(self) -> None:
        with self._lock:
            self._scripts.clear()
            self._seen.clear()

    def _take_fault(
        self, method: str, path: str, query: str, headers: dict[str, str], size: int = 0
    ) -> str | None:
        with self._lock:
            for script in self._scripts:
                if script.remaining > 0 and script.matches(method, path, query, headers):
                    if script.skip > 0:
                        script.skip -= 1
                        continue
                    script.remaining -= 1
                    fault = script.kind
                    break
            else:
                fault = None
                if self._chaos is not None:
                    rate, kinds, rng = self._chaos
                    if rng.random() < rate:
                        fault = rng.choice(kinds)
            if fault is not None:
                self.faults_by_kind[fault] = self.faults_by_kind.get(fault, 0) + 1
            if self.record:
                self._seen.append(Seen(method, path, query, headers, fault, size))
            return fault

    # -- serving ---------------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as botocore's pool expects
            # headers and body go out in separate writes: without TCP_NODELAY each response
            # would wait out the client's delayed ACK (~40 ms)
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet: tests read `seen()` instead

            def _read_body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    chunks: list[bytes] = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length", "0") or 0)
                return self.rfile.read(length) if length else b""

            def _handle(self) -> None:
                body = self._read_body()
                path, _, query = self.path.partition("?")
                headers = {k.lower(): v for k, v in self.headers.items()}
                fault = proxy._take_fault(self.command, path, query, headers, len(body))
                if fault is None:
                    proxy._wait_if_held(self.command, path, query, headers)
                if fault == DROP:
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault == DROP_AFTER:
                    self._forward(body, answer=False)
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault is not None:
                    self._send_error_xml(*FAULTS[fault], resource=path)
                    return
                self._forward(body)

            def _send_error_xml(self, status: int, code: str, message: str, resource: str) -> None:
                xml = (
                    '<?xml version="1.0" encoding="UTF-8"?>\n'
                    f"<Error><Code>{code}</Code><Message>{message}</Message>"
                    f"<Resource>{resource}</Resource><RequestId>faultproxy</RequestId></Error>"
                ).encode()
                self.send_response_only(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("x-amz-request-id", "faultproxy")
                self.send_header("Content-Length", str(len(xml)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(xml)

            def _forward(self, body: bytes, *, answer: bool = True) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    headers = {k: v for k, v in headers.items() if k.lower() != "content-length"}
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(
                    proxy.upstream_host, proxy.upstream_port, timeout=60
                )
                try:
                    # Host is among `headers`, so http.client sends it as is: the signature
                    # boto3 computed over it stays valid
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    if not answer:
                        return
                    self.send_response_only(resp.status, resp.reason)
                    for name, value in resp.getheaders():
                        lowered = name.lower()
                        if lowered in _HOP_BY_HOP:
                            continue
                        if lowered == "content-length" and self.command != "HEAD":
                            continue  # re-sent below for the body actually relayed
                        self.send_header(name, value)
                    if self.command != "HEAD":
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                    else:
                        self.end_headers()
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        return Handler
