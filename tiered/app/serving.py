"""The server base the daemon's two listeners share, the HTTP API (`tiered.app.http_server`)
and the Kafka endpoint (`tiered.app.kafka_api.server`): a thread per connection and the limits
that keep one client, or many from one address, from hurting the others (docs/kafka-api.md,
"Limits and security"; docs/remote-read.md, "HTTP endpoint").

A connection is always in one of four states, set by its thread (`Client`):

* IDLE: waiting for the first byte of its next request; closed after `idle_timeout_s`.
* READING: a request's first byte arrived (or a TLS handshake began); the whole request must
  be in within `request_timeout_s` of that byte, however its bytes trickle in. A monitor
  thread cuts a connection past its deadline: a per-read timeout alone lets a client that sends
  one byte a minute hold its slot for ever.
* WORKING: the request is being answered (the server's own time, a fetch waiting at the log
  end included); never cut but on stop.
* WRITING: the answer is going out; a write that stalls for `io_timeout_s` fails.

At most `max_connections` connections are served, at most `max_connections_per_ip` of them
from one address. One more from an address at its limit is closed at once. One more beyond
`max_connections` reclaims the connection that has waited on its client the longest (idle,
slow to send its request or slow to read its answer): a well-behaved client gets in at once
rather than after every hostile connection's timeout. When every connection is WORKING, the
newcomer is closed at once. Refusals, reclaims and deadline cuts are logged at most once per
`NOTICE_S` each.

`stop()` closes the listener, cuts idle and reading connections, waits up to `drain_s` for
the requests being answered, then cuts whatever is left.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import logging
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["IO_TIMEOUT_S", "NOTICE_S", "UNLIMITED", "Client", "ConnectionServer", "Limits", "State"]

#: seconds one socket read inside a request, or one write of an answer, may stall
IO_TIMEOUT_S = 60.0
#: at most one log line per kind (refused, reclaimed, timed out) per this many seconds
NOTICE_S = 10.0
#: Kafka's `max.connections.per.ip` default: no limit per address beyond max_connections
UNLIMITED = 2**31 - 1
#: the longest socket timeout set (Kafka's largest ms value); more overflows the C timeval
_MAX_TIMEOUT_S = UNLIMITED / 1000


class State(enum.Enum):
    IDLE = "idle"
    READING = "reading"
    WORKING = "working"
    WRITING = "writing"


#: states in which a connection waits on its client: the ones a newcomer may reclaim
_WAITING = (State.IDLE, State.READING, State.WRITING)


@dataclass(frozen=True)
class Limits:
    """One server's limits; the config keys that set them are named in its log lines."""

    max_connections: int = 1000
    max_connections_per_ip: int = UNLIMITED
    request_timeout_s: float = 30.0
    idle_timeout_s: float = 600.0
    io_timeout_s: float = IO_TIMEOUT_S
    #: seconds `stop()` waits for requests being answered
    drain_s: float = 10.0


class Client:
    """One accepted connection as its thread and the server's monitor see it. The thread
    moves it between states; the server may cut it (shut its socket down) from another
    thread, which ends whatever read or write the thread is blocked in."""

    def __init__(self, server: ConnectionServer, sock: socket.socket, peer: Any,
                 conn_id: int) -> None:
        self._server = server
        self.sock = sock
        self.peer = peer
        self.peer_host = str(peer[0])
        self.id = conn_id
        # the three below change under the server's lock
        self.state = State.IDLE
        #: monotonic time the current state began
        self.since = time.monotonic()
        #: monotonic time the request being read must be whole by; None outside READING
        self.deadline: float | None = None
        #: why the server cut this connection; None while it has not
        self.cut_reason: str | None = None

    def idle(self) -> bool:
        """Waiting for the next request; False when the server stops (end the connection)."""
        return self._server._move(self, State.IDLE)

    def reading(self) -> None:
        """The request's first byte arrived: its deadline starts now."""
        self._server._move(self, State.READING)

    def working(self) -> None:
        """The request is whole and being answered."""
        self._server._move(self, State.WORKING)

    def writing(self) -> None:
        """The answer is being sent."""
        self._server._move(self, State.WRITING)


class ConnectionServer:
    """A listening socket on (`host`, `port`) that serves each connection on its own thread
    with `serve(client)`, under `limits`. `serve` moves the client between states, returns
    when the connection should end, and never closes the socket (the server does).

    `section` names the config section of the limits in log lines ("[kafka]"); `tls` makes
    every connection do a TLS handshake on its own thread first, under the request deadline.
    Binds in the constructor (OSError when it cannot); serves between `start()` and
    `stop()`."""

    def __init__(self, name: str, host: str, port: int, limits: Limits,
                 serve: Callable[[Client], None], *, section: str,
                 tls: ssl.SSLContext | None = None,
                 log: logging.Logger | None = None) -> None:
        self.name = name
        self.limits = limits
        self._serve = serve
        self._section = section
        self._tls = tls
        self._log = log or logging.getLogger(__name__)
        self._sock = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
            backlog=128)
        self._sock.settimeout(0.5)  # the accept loop looks at the stop flag this often
        host, port = self._sock.getsockname()[:2]
        #: where it listens (the bound port when asked for 0), known after stop too
        self.address: tuple[str, int] = (str(host), int(port))
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._clients: dict[int, tuple[Client, threading.Thread]] = {}
        self._ids = itertools.count(1)
        self._stopping = False
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._noticed: dict[str, float] = {}
        self._counts: Counter[str] = Counter()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stats(self) -> dict[str, int]:
        """connections (being served), connections_reading (of those, mid-request: how a
        trickling attack shows), connections_total (accepted and served),
        connections_refused, connections_reclaimed, closed_slow_requests."""
        with self._lock:
            return {"connections": len(self._clients),
                    "connections_reading": sum(1 for c, _t in self._clients.values()
                                               if c.state is State.READING),
                    "connections_total": self._counts["accepted"],
                    "connections_refused": self._counts["refused"],
                    "connections_reclaimed": self._counts["reclaimed"],
                    "closed_slow_requests": self._counts["slow"]}

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        for target, suffix in ((self._accept_loop, ""), (self._monitor, "-monitor")):
            thread = threading.Thread(target=target, name=f"tiered-{self.name}{suffix}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> int:
        """Close the listener, cut idle and reading connections, wait up to `drain_s` for
        requests being answered, then cut the rest. Returns how many requests were still
        running (and cut). Idempotent."""
        with self._lock:
            self._stopping = True
        self._stopped.set()
        with contextlib.suppress(OSError):  # wakes the accept loop; new connections are refused
            self._sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join()
        self._threads = []
        self._sock.close()
        with self._lock:
            for client, _thread in self._clients.values():
                if client.state in (State.IDLE, State.READING):
                    self._cut(client, "the server stops")
        with self._changed:
            self._changed.wait_for(lambda: not self._clients, self.limits.drain_s)
            left = list(self._clients.values())
            for client, _thread in left:
                self._cut(client, "the server stops")
        if left:
            self._log.warning("%s: %d request(s) still running after %.0f s; closing anyway",
                              self.name, len(left), self.limits.drain_s)
            end = time.monotonic() + 1.0
            for _client, thread in left:
                thread.join(max(0.0, end - time.monotonic()))
        return len(left)

    # -- states ----------------------------------------------------------------------------

    def _move(self, client: Client, state: State) -> bool:
        limits = self.limits
        with self._lock:
            if client.state is not state:  # a fresh connection has been idle since accept
                client.since = time.monotonic()
            client.state = state
            client.deadline = (client.since + limits.request_timeout_s
                               if state is State.READING else None)
            stopping = self._stopping
        # a single stall is bounded by the socket; the whole request by the monitor
        with contextlib.suppress(OSError):
            if state is State.IDLE:
                client.sock.settimeout(min(limits.idle_timeout_s, _MAX_TIMEOUT_S))
            elif state is State.READING:
                client.sock.settimeout(min(limits.io_timeout_s, limits.request_timeout_s,
                                           _MAX_TIMEOUT_S))
            elif state is State.WRITING:
                client.sock.settimeout(min(limits.io_timeout_s, _MAX_TIMEOUT_S))
        return not (stopping and state is State.IDLE)

    def _cut(self, client: Client, reason: str) -> None:
        """Shut the connection's socket down (its thread then ends and closes it). Called
        under the lock; the socket-level call also cuts a TLS socket under its TLS layer."""
        if client.cut_reason is not None:
            return
        client.cut_reason = reason
        with contextlib.suppress(OSError):
            socket.socket.shutdown(client.sock, socket.SHUT_RDWR)

    def _notice(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._noticed.get(kind, -NOTICE_S) >= NOTICE_S:
            self._noticed[kind] = now
            self._log.warning(message, *args)

    # -- threads ---------------------------------------------------------------------------

    def _monitor(self) -> None:
        """Cut every connection whose request is not whole by its deadline."""
        limits = self.limits
        tick = max(0.01, min(1.0, limits.request_timeout_s / 10))
        while not self._stopped.wait(tick):
            now = time.monotonic()
            late: list[Client] = []
            with self._lock:
                for client, _thread in self._clients.values():
                    if (client.deadline is not None and client.deadline <= now
                            and client.cut_reason is None):
                        self._cut(client, "request not complete in time")
                        self._counts["slow"] += 1
                        late.append(client)
            for client in late:
                self._notice("slow", "%s: closed a connection from %s: its request was not "
                             "complete within %s request_timeout_ms = %d of its first byte",
                             self.name, client.peer_host, self._section,
                             round(limits.request_timeout_s * 1000))

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                sock, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stopped.is_set():
                    return
                self._log.warning("%s: accept failed: %s", self.name, exc)
                time.sleep(0.1)
                continue
            self._admit(sock, peer)

    def _admit(self, sock: socket.socket, peer: Any) -> None:
        limits = self.limits
        host = str(peer[0])
        refusal: tuple[str, int] | None = None
        victim: Client | None = None
        thread: threading.Thread | None = None
        with self._lock:
            live = [c for c, _t in self._clients.values() if c.cut_reason is None]
            if self._stopping:
                refusal = ("", 0)
            elif sum(1 for c in live if c.peer_host == host) >= limits.max_connections_per_ip:
                refusal = ("max_connections_per_ip", limits.max_connections_per_ip)
            elif len(live) >= limits.max_connections:
                waiting = [c for c in live if c.state in _WAITING]
                if waiting:
                    victim = min(waiting, key=lambda c: c.since)
                    self._cut(victim, "reclaimed for a new connection")
                    self._counts["reclaimed"] += 1
                else:
                    refusal = ("max_connections", limits.max_connections)
            if refusal is not None:
                self._counts["refused"] += 1
            else:
                self._counts["accepted"] += 1
                client = Client(self, sock, peer, next(self._ids))
                thread = threading.Thread(target=self._run, args=(client,),
                                          name=f"tiered-{self.name}-{client.id}", daemon=True)
                self._clients[client.id] = (client, thread)
        if thread is None:
            with contextlib.suppress(OSError):
                sock.close()
            key, value = refusal or ("", 0)
            if key:
                self._notice(key, "%s: closed a connection from %s: already serving %s = %d "
                             "(%s %s)", self.name, host, key, value, self._section, key)
            return
        if victim is not None:
            self._notice("reclaimed", "%s: closed the connection from %s that waited on its "
                         "client the longest (%s for %.1f s) to serve a new one: already "
                         "serving max_connections = %d (%s max_connections)", self.name,
                         victim.peer_host, victim.state.value, time.monotonic() - victim.since,
                         limits.max_connections, self._section)
        thread.start()

    def _run(self, client: Client) -> None:
        try:
            client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                self._handshake(client)
            self._serve(client)
        except (OSError, ssl.SSLError) as exc:  # resets, timeouts, TLS failures: theirs alone
            self._log.debug("%s: connection from %s ended: %s", self.name, client.peer_host,
                            client.cut_reason or exc)
        except Exception:
            self._log.exception("%s: closing the connection from %s after an internal error",
                                self.name, client.peer_host)
        finally:
            with contextlib.suppress(OSError):
                client.sock.close()
            with self._changed:
                self._clients.pop(client.id, None)
                self._changed.notify_all()

    def _handshake(self, client: Client) -> None:
        """TLS on the connection's own thread, under the request deadline: a client that
        stalls its handshake holds only its own slot, and not for long."""
        assert self._tls is not None  # noqa: S101 - only called with TLS
        wrapped = self._tls.wrap_socket(client.sock, server_side=True,
                                        do_handshake_on_connect=False)
        with self._lock:
            client.sock = wrapped
            if client.cut_reason is not None:  # cut while the socket changed hands
                with contextlib.suppress(OSError):
                    socket.socket.shutdown(wrapped, socket.SHUT_RDWR)
        client.reading()
        wrapped.do_handshake()
