"""The `[http]` section: the limits of `tiered run`'s HTTP server, which serves `/metrics`,
`/health` and the records API (docs/configuration.md, "[http]"; docs/remote-read.md, "HTTP
endpoint"). Where it listens stays on the command line (`--metrics-host`, `--metrics-port`).

    [http]
    auth = "basic"                   # with tls_cert / tls_key (docs/security.md)
    max_connections = 1000
    max_connections_per_ip = 2147483647
    request_timeout_ms = "30s"
    idle_timeout_ms = "60s"

Pure parsing: every problem goes through `add(where, message)`, naming the key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiered.config.security import HTTP_SECURITY_KEYS, http_security_fields
from tiered.config.units import UnitError, describe, parse_duration_ms, parse_int

__all__ = ["HTTP_KEYS", "HttpConfig", "parse_http"]


@dataclass(frozen=True)
class HttpConfig:
    """The HTTP server's limits, the same kinds as the Kafka endpoint's."""

    #: connections served at once; beyond it the one waiting on its client the longest is
    #: closed for the newcomer, or the newcomer when every connection is busy
    max_connections: int = 1000
    #: connections from one address (2147483647: no limit but max_connections)
    max_connections_per_ip: int = 2**31 - 1
    #: a request must be whole within this long of its first byte
    request_timeout_ms: int = 30_000
    #: a keep-alive connection with no request for this long is closed
    idle_timeout_ms: int = 60_000
    #: "basic": the records API and /metrics need a user and an ACL (docs/security.md)
    auth: str = "none"
    #: PEM files: HTTPS, and with a client CA mutual TLS
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


#: key -> (parser, smallest allowed value)
_NUMBERS: dict[str, tuple[Callable[[object], int], int]] = {
    "max_connections": (parse_int, 1),
    "max_connections_per_ip": (parse_int, 1),
    "request_timeout_ms": (parse_duration_ms, 1000),
    "idle_timeout_ms": (parse_duration_ms, 1000),
}
HTTP_KEYS: tuple[str, ...] = (*_NUMBERS, *HTTP_SECURITY_KEYS)


def parse_http(table: object, base: Path, add: Callable[[str, str], None]) -> HttpConfig:
    """The `[http]` section (defaults without one; relative paths against `base`); each
    problem goes to `add("[http] key", message)`."""
    if table is None:
        return HttpConfig()
    if not isinstance(table, Mapping):
        add("[http]", f"must be a table (an [http] section), got {describe(table)}")
        return HttpConfig()
    values: dict[str, Any] = http_security_fields(table, base, add)
    for key, raw in table.items():
        if key in HTTP_SECURITY_KEYS:
            continue
        if key not in _NUMBERS:
            add(f"[http] {key}", _unknown(key))
            continue
        parse, lowest = _NUMBERS[key]
        try:
            value = parse(raw)
        except UnitError as exc:
            add(f"[http] {key}", str(exc))
            continue
        if value < lowest:
            add(f"[http] {key}", f"must be at least {lowest}, got {value}")
            continue
        values[key] = value
    return dataclasses.replace(HttpConfig(), **values)


def _unknown(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(HTTP_KEYS), n=1, cutoff=0.6)
    return (f"unknown key (did you mean {close[0]}?)" if close
            else f"unknown key; expected {', '.join(HTTP_KEYS)}")
