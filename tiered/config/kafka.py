"""The `[kafka]` section: where `tiered run` serves the read-only Kafka protocol, and its limits
(docs/configuration.md, "[kafka]"; docs/kafka-api.md).

    [kafka]
    listen = "127.0.0.1:9092"      # required to turn the endpoint on; "9092" means loopback
    advertised = "host:9092"        # what Metadata tells clients; default: the listen address
    tls_cert = "server.pem"         # PEM certificate chain and private key: TLS (both or none)
    tls_key = "server.key"
    max_connections = 1000
    max_request_bytes = "8 MiB"
    idle_timeout_ms = "10m"
    group_initial_rebalance_delay_ms = 3000
    group_min_session_timeout_ms = 6000
    group_max_session_timeout_ms = "30m"
    offset_metadata_max_bytes = 4096         # Kafka's names are aliases:
    offsets_retention_minutes = 10080        #   "offsets.retention.minutes" = 10080
    offsets_retention_check_interval_ms = "10m"
    max_groups = 10000
    max_offsets_per_group = 1000
    fetch_max_bytes = "55 MiB"      # one Fetch answer at most (Kafka's fetch.max.bytes)
    max_partitions_per_fetch = 1000 # partitions one Fetch reads; the rest wait their turn
    request_timeout_ms = "30s"      # a request must be whole this long after its first byte
    max_connections_per_ip = 100    # default 2147483647 (Kafka's): max_connections alone
    catalog_refresh_ms = "10s"      # how often the bucket's topic list is read again

Pure parsing: every problem is reported through `add(where, message)`, naming the key. Whether
the certificate files load is checked when the daemon starts (`tiered.app.kafka_api.server`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiered.config.security import KAFKA_SECURITY_KEYS, KafkaSecurity, parse_kafka_security
from tiered.config.units import (
    UnitError,
    describe,
    parse_duration_ms,
    parse_int,
    parse_size,
)

__all__ = ["DEFAULT_HOST", "KAFKA_ALIASES", "KAFKA_KEYS", "KafkaConfig", "parse_address",
           "parse_kafka"]

#: where the endpoint listens when `listen` gives only a port
DEFAULT_HOST = "127.0.0.1"
#: hosts that mean "every interface": no client can connect to them, so Metadata needs
#: `advertised`
_WILDCARDS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class KafkaConfig:
    """The Kafka endpoint's settings (docs/configuration.md, "[kafka]")."""

    listen_host: str
    #: 0: any free port (tests); the advertised port then follows the bound one
    listen_port: int
    #: None: advertise the listen address
    advertised_host: str | None = None
    advertised_port: int | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: connections served at once; one more is accepted and closed at once with a log line
    max_connections: int = 1000
    #: largest request frame accepted; a larger one closes its connection
    max_request_bytes: int = 8 << 20
    #: a connection with no request for this long is closed (Kafka's connections.max.idle.ms)
    idle_timeout_ms: int = 600_000
    #: how long a new group waits for more members before its first rebalance completes
    group_initial_rebalance_delay_ms: int = 3000
    #: the session timeouts a joining member may ask for (Kafka's group.*.session.timeout.ms)
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    #: longest OffsetCommit metadata, in characters as Kafka counts (offset.metadata.max.bytes)
    offset_metadata_max_bytes: int = 4096
    #: a committed offset expires this long after its commit while its group has no members
    #: (Kafka's offsets.retention.minutes)
    offsets_retention_minutes: int = 10080
    #: how often expired offsets are collected (Kafka's offsets.retention.check.interval.ms)
    offsets_retention_check_interval_ms: int = 600_000
    #: groups with committed offsets in the bucket; a commit creating one more is refused
    max_groups: int = 10_000
    #: partitions one group may hold committed offsets for
    max_offsets_per_group: int = 1000
    #: one Fetch answer's records at most, whatever the request's max_bytes (Kafka's broker
    #: fetch.max.bytes); the first batch of the first partition with data comes regardless
    fetch_max_bytes: int = 57_671_680
    #: distinct partitions one Fetch reads; those past it get no data that time
    max_partitions_per_fetch: int = 1000
    # -- deadlines and per-address limit (tiered.app.serving)
    #: a request must be whole within this long of its first byte, however it trickles in
    request_timeout_ms: int = 30_000
    #: connections from one address; Kafka's max.connections.per.ip default: no limit but
    #: max_connections (on loopback every client is 127.0.0.1)
    max_connections_per_ip: int = 2**31 - 1
    #: SASL, mutual TLS and ACL settings (tiered.config.security; docs/security.md)
    security: KafkaSecurity = KafkaSecurity()
    #: how often the bucket's topics are listed again for Metadata, ListOffsets and the group
    #: APIs (docs/kafka-api.md, "The topic catalog")
    catalog_refresh_ms: int = 10_000

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


#: int-valued keys: key -> (parser, smallest allowed value)
_NUMBERS: dict[str, tuple[Callable[[object], int], int]] = {
    "max_connections": (parse_int, 1),
    "max_request_bytes": (parse_size, 1024),
    "idle_timeout_ms": (parse_duration_ms, 1000),
    "group_initial_rebalance_delay_ms": (parse_duration_ms, 0),
    "group_min_session_timeout_ms": (parse_duration_ms, 1),
    "group_max_session_timeout_ms": (parse_duration_ms, 1),
    "offset_metadata_max_bytes": (parse_int, 0),
    "offsets_retention_minutes": (parse_int, 1),
    "offsets_retention_check_interval_ms": (parse_duration_ms, 1000),
    "max_groups": (parse_int, 1),
    "max_offsets_per_group": (parse_int, 1),
    "fetch_max_bytes": (parse_size, 1),
    "max_partitions_per_fetch": (parse_int, 1),
    "request_timeout_ms": (parse_duration_ms, 1000),
    "max_connections_per_ip": (parse_int, 1),
    "catalog_refresh_ms": (parse_duration_ms, 100),
}
#: largest values of the keys that have one
_HIGHEST = {"offset_metadata_max_bytes": 1 << 20}
#: Kafka's broker property names accepted for the key they stand for
KAFKA_ALIASES: dict[str, str] = {
    "offset.metadata.max.bytes": "offset_metadata_max_bytes",
    "offsets.retention.minutes": "offsets_retention_minutes",
    "offsets.retention.check.interval.ms": "offsets_retention_check_interval_ms",
}
KAFKA_KEYS: tuple[str, ...] = ("listen", "advertised", "tls_cert", "tls_key", *_NUMBERS,
                               *KAFKA_SECURITY_KEYS)


def parse_address(text: object, *, default_host: str | None, min_port: int) -> tuple[str, int]:
    """"HOST:PORT", "[IPv6]:PORT", or (with `default_host`) a bare "PORT" / ":PORT". Raises
    `UnitError` saying what was expected."""
    if not isinstance(text, str) or not text.strip():
        raise UnitError(f"expected \"HOST:PORT\", got {describe(text)}")
    text = text.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise UnitError(f"expected \"[IPv6]:PORT\", got {text!r}")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise UnitError(f"{host!r} is not an IPv6 address") from None
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            host, port = "", text
        if ":" in host:
            raise UnitError(f"write an IPv6 address in brackets, \"[{host}]:{port}\"")
        if not host:
            if default_host is None:
                raise UnitError(f"expected \"HOST:PORT\" with a host, got {text!r}")
            host = default_host
    if not port.isdigit() or not min_port <= int(port) <= 65535:
        raise UnitError(f"port must be an integer {min_port}..65535, got {port!r}")
    return host, int(port)


def parse_kafka(table: object, base: Path, add: Callable[[str, str], None]
                ) -> KafkaConfig | None:
    """The `[kafka]` section (None when there is none: the endpoint is off). Relative paths
    resolve against `base`; each problem goes to `add("[kafka] key", message)`."""
    if table is None:
        return None
    if not isinstance(table, Mapping):
        add("[kafka]", f"must be a table (a [kafka] section), got {describe(table)}")
        return None
    for key in table:
        if key not in KAFKA_KEYS and key not in KAFKA_ALIASES:
            add(f"[kafka] {key}", _unknown(key))
    ok = True
    table = _resolve_aliases(table, add)
    if table is None:
        return None
    listen: tuple[str, int] = (DEFAULT_HOST, 0)
    if "listen" not in table:
        add("[kafka] listen", "required to serve the Kafka protocol, e.g. \"127.0.0.1:9092\" "
            "(leave out the [kafka] section to turn the endpoint off)")
        ok = False
    else:
        try:
            listen = parse_address(table["listen"], default_host=DEFAULT_HOST, min_port=0)
        except UnitError as exc:
            add("[kafka] listen", str(exc))
            ok = False
    advertised: tuple[str, int] | None = None
    if "advertised" in table:
        try:
            advertised = parse_address(table["advertised"], default_host=None, min_port=1)
        except UnitError as exc:
            add("[kafka] advertised", str(exc))
            ok = False
    elif ok and listen[0] in _WILDCARDS:
        add("[kafka] advertised", f"required when listen is {listen[0] or '*'} (every "
            "interface): clients need an address they can connect to, e.g. \"broker1:9092\"")
        ok = False
    tls = _tls_paths(table, base, add)
    numbers: dict[str, Any] = {}  # KafkaConfig field -> value
    for key, (parse, lowest) in _NUMBERS.items():
        if key not in table:
            continue
        try:
            value = parse(table[key])
        except UnitError as exc:
            add(f"[kafka] {key}", str(exc))
            ok = False
            continue
        if value < lowest:
            add(f"[kafka] {key}", f"must be at least {lowest}, got {value}")
            ok = False
            continue
        if key in _HIGHEST and value > _HIGHEST[key]:
            add(f"[kafka] {key}", f"must be at most {_HIGHEST[key]}, got {value}")
            ok = False
            continue
        numbers[key] = value
    if tls is None:
        ok = False
    # security keys (docs/security.md): parsed on their own, PLAIN needs to know about TLS
    security = parse_kafka_security(table, base, add, tls=tls is not None and tls[0] is not None)
    if security is None:
        ok = False
    else:
        numbers["security"] = security
    if not ok:
        return None
    adv_host, adv_port = advertised if advertised is not None else (None, None)
    cert, key = tls if tls is not None else (None, None)
    config = dataclasses.replace(
        KafkaConfig(listen[0], listen[1], adv_host, adv_port, cert, key), **numbers)
    if config.group_min_session_timeout_ms > config.group_max_session_timeout_ms:
        add("[kafka] group_min_session_timeout_ms",
            "must not exceed group_max_session_timeout_ms")
        return None
    return config


def _tls_paths(table: Mapping[str, Any], base: Path, add: Callable[[str, str], None]
               ) -> tuple[Path | None, Path | None] | None:
    """(cert, key) resolved against `base`, (None, None) without TLS, None on a problem."""
    paths: dict[str, Path | None] = {}
    for key in ("tls_cert", "tls_key"):
        raw = table.get(key)
        if raw is None:
            paths[key] = None
        elif not isinstance(raw, str) or not raw.strip():
            add(f"[kafka] {key}", f"expected a file path, got {describe(raw)}")
            return None
        else:
            path = Path(os.path.expanduser(raw))
            paths[key] = path if path.is_absolute() else base / path
    if (paths["tls_cert"] is None) != (paths["tls_key"] is None):
        missing = "tls_key" if paths["tls_key"] is None else "tls_cert"
        add(f"[kafka] {missing}", "required with the other half: set tls_cert and tls_key "
            "together (PEM files) to serve TLS, or neither for plain TCP")
        return None
    return paths["tls_cert"], paths["tls_key"]


def _resolve_aliases(table: Mapping[str, Any], add: Callable[[str, str], None]
                     ) -> Mapping[str, Any] | None:
    """`table` with Kafka's property names replaced by tiered's keys; None (reported) when
    a key is given both ways."""
    resolved = {k: v for k, v in table.items() if k not in KAFKA_ALIASES}
    for alias, key in KAFKA_ALIASES.items():
        if alias not in table:
            continue
        if key in table:
            add(f"[kafka] {alias}", f"is another name for {key}, which is set too; keep one")
            return None
        resolved[key] = table[alias]
    return resolved


def _unknown(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(KAFKA_KEYS), n=1, cutoff=0.6)
    return (f"unknown key (did you mean {close[0]}?)" if close
            else f"unknown key; expected {', '.join(KAFKA_KEYS)}")
