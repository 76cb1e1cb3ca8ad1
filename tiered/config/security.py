"""Who may connect and what they may read: the security keys of `[kafka]` and the `[http]`
section (docs/configuration.md; docs/security.md).

    [kafka]
    sasl_mechanisms = ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]   # absent/empty: no SASL
    allow_plaintext_sasl = false     # PLAIN without TLS is refused unless true
    tls_client_ca = "ca.pem"         # mutual TLS: client certificates required and verified
    tls_principal_rule = "RULE:^CN=([^,]+),OU=apps.*$/$1/L"          # optional, else the CN
    allow_everyone_if_no_acl = false
    super_users = ["User:admin"]
    session_lifetime_ms = 0          # KIP-368: 0 = sessions never expire

    [http]
    auth = "basic"                   # "none" (default) or "basic"
    tls_cert = "http.pem"
    tls_key = "http.key"
    tls_client_ca = "ca.pem"         # optional mutual TLS

Pure parsing, every problem reported through `add(where, message)` naming the key; whether
the files load is checked when the daemon starts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiered.config.units import UnitError, describe, parse_duration_ms

__all__ = ["HTTP_SECURITY_KEYS", "KAFKA_SECURITY_KEYS", "SASL_MECHANISMS", "KafkaSecurity",
           "PrincipalRule", "http_security_fields", "parse_kafka_security", "parse_principal_rules"]

SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
KAFKA_SECURITY_KEYS = ("sasl_mechanisms", "allow_plaintext_sasl", "tls_client_ca",
                       "tls_principal_rule", "allow_everyone_if_no_acl", "super_users",
                       "session_lifetime_ms")
HTTP_SECURITY_KEYS = ("auth", "tls_cert", "tls_key", "tls_client_ca")
HTTP_AUTH = ("none", "basic")
_PRINCIPAL = re.compile(r"User:[^\x00-\x1f]{1,255}")
_RULE = re.compile(r"RULE:(?P<pattern>(?:[^/\\]|\\.)+)/(?P<replacement>(?:[^/\\]|\\.)*)/"
                   r"(?P<case>[LU])?")


@dataclass(frozen=True)
class PrincipalRule:
    """One of Kafka's `ssl.principal.mapping.rules`: `RULE:regex/replacement/[L|U]` matched
    against the whole subject DN (RFC 2253, e.g. `CN=alice,OU=apps,O=acme`), or `DEFAULT`
    (the subject's CN)."""

    pattern: re.Pattern[str] | None
    replacement: str = ""
    case: str = ""


@dataclass(frozen=True)
class KafkaSecurity:
    """The Kafka endpoint's authentication and authorization settings."""

    sasl_mechanisms: tuple[str, ...] = ()
    allow_plaintext_sasl: bool = False
    tls_client_ca: Path | None = None
    tls_principal_rules: tuple[PrincipalRule, ...] = ()
    allow_everyone_if_no_acl: bool = False
    super_users: tuple[str, ...] = ()
    session_lifetime_ms: int = 0

    @property
    def authenticates(self) -> bool:
        """Clients prove who they are (SASL or a client certificate): ACLs are enforced.
        Without either every client is anonymous and everything is allowed, as before."""
        return bool(self.sasl_mechanisms) or self.tls_client_ca is not None


def _path(raw: object, base: Path, where: str, add: Callable[[str, str], None]
          ) -> Path | None | bool:
    """The path (resolved against `base`), None when not set, False on a problem."""
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip():
        add(where, f"expected a file path, got {describe(raw)}")
        return False
    path = Path(os.path.expanduser(raw))
    return path if path.is_absolute() else base / path


def _bool(table: Mapping[str, Any], key: str, where: str, add: Callable[[str, str], None]
          ) -> bool | None:
    value = table.get(key, False)
    if not isinstance(value, bool):
        add(where, f"expected true or false, got {describe(value)}")
        return None
    return value


def parse_principal_rules(raw: object) -> tuple[PrincipalRule, ...]:
    """`tls_principal_rule`: one rule or a list of them, tried in order. `UnitError` saying
    what is wrong."""
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
        raise UnitError(f"expected a rule \"RULE:regex/replacement/\" or \"DEFAULT\", or a "
                        f"list of them, got {describe(raw)}")
    rules = []
    for item in items:
        text = item.strip()
        if text == "DEFAULT":
            rules.append(PrincipalRule(None))
            continue
        m = _RULE.fullmatch(text)
        if m is None:
            raise UnitError(f"{text!r} is not \"RULE:regex/replacement/\" (optionally ending "
                            "L or U for lower or upper case) or \"DEFAULT\"")
        try:
            pattern = re.compile(m["pattern"].replace("\\/", "/"))
        except re.error as exc:
            raise UnitError(f"{text!r}: bad regular expression: {exc}") from None
        replacement = re.sub(r"\$(\d)", r"\\\1", m["replacement"].replace("\\/", "/"))
        rules.append(PrincipalRule(pattern, replacement, m["case"] or ""))
    return tuple(rules)


def parse_kafka_security(table: Mapping[str, Any], base: Path, add: Callable[[str, str], None],
                         *, tls: bool) -> KafkaSecurity | None:
    """The security keys of `[kafka]` (`tls`: the listener has a certificate); None when a
    problem was reported."""
    ok = True
    mechanisms: tuple[str, ...] = ()
    raw = table.get("sasl_mechanisms", [])
    if not isinstance(raw, list) or not all(isinstance(m, str) for m in raw):
        add("[kafka] sasl_mechanisms", f"expected a list of {', '.join(SASL_MECHANISMS)}, got "
            f"{describe(raw)}")
        ok = False
    else:
        unknown = [m for m in raw if m not in SASL_MECHANISMS]
        if unknown:
            add("[kafka] sasl_mechanisms", f"unknown mechanism(s) {', '.join(map(repr, unknown))}"
                f"; expected any of {', '.join(SASL_MECHANISMS)}")
            ok = False
        mechanisms = tuple(dict.fromkeys(raw))
    flags = {k: _bool(table, k, f"[kafka] {k}", add)
             for k in ("allow_plaintext_sasl", "allow_everyone_if_no_acl")}
    if None in flags.values():
        ok = False
    if "PLAIN" in mechanisms and not tls and flags["allow_plaintext_sasl"] is False:
        add("[kafka] allow_plaintext_sasl", "PLAIN in sasl_mechanisms sends passwords in the "
            "clear on a listener without TLS: set tls_cert and tls_key, or set "
            "allow_plaintext_sasl = true to accept that")
        ok = False
    ca = _path(table.get("tls_client_ca"), base, "[kafka] tls_client_ca", add)
    if ca is False:
        ok = False
    elif ca is not None and not tls:
        add("[kafka] tls_client_ca", "mutual TLS needs TLS: set tls_cert and tls_key too")
        ok = False
    rules: tuple[PrincipalRule, ...] = ()
    if "tls_principal_rule" in table:
        try:
            rules = parse_principal_rules(table["tls_principal_rule"])
        except UnitError as exc:
            add("[kafka] tls_principal_rule", str(exc))
            ok = False
    supers = table.get("super_users", [])
    if not isinstance(supers, list) or not all(
            isinstance(s, str) and _PRINCIPAL.fullmatch(s) for s in supers):
        add("[kafka] super_users", f"expected a list of principals like \"User:admin\", got "
            f"{describe(supers)}")
        ok = False
    lifetime = 0
    if "session_lifetime_ms" in table:
        try:
            lifetime = parse_duration_ms(table["session_lifetime_ms"])
        except UnitError as exc:
            add("[kafka] session_lifetime_ms", str(exc))
            ok = False
    if not ok:
        return None
    return KafkaSecurity(mechanisms, bool(flags["allow_plaintext_sasl"]),
                         ca if isinstance(ca, Path) else None, rules,
                         bool(flags["allow_everyone_if_no_acl"]), tuple(supers), lifetime)


def http_security_fields(table: Mapping[str, Any], base: Path,
                         add: Callable[[str, str], None]) -> dict[str, Any]:
    """`auth` and the TLS files of the `[http]` section (docs/security.md), as fields of
    `tiered.config.http.HttpConfig`; problems go to `add`."""
    auth = table.get("auth", "none")
    if auth not in HTTP_AUTH:
        add("[http] auth", f"expected \"none\" or \"basic\", got {describe(auth)}")
        auth = "none"
    paths = {k: _path(table.get(k), base, f"[http] {k}", add)
             for k in ("tls_cert", "tls_key", "tls_client_ca")}
    got = {k: v if isinstance(v, Path) else None for k, v in paths.items()}
    if (got["tls_cert"] is None) != (got["tls_key"] is None) and False not in paths.values():
        add("[http] tls_key" if got["tls_key"] is None else "[http] tls_cert",
            "set tls_cert and tls_key together (PEM files) to serve HTTPS, or neither")
    if got["tls_client_ca"] is not None and got["tls_cert"] is None:
        add("[http] tls_client_ca", "mutual TLS needs TLS: set tls_cert and tls_key too")
    if auth == "basic" and got["tls_cert"] is None:
        add("[http] auth", "basic sends passwords in the clear without TLS: set tls_cert and "
            "tls_key too")
    return {"auth": str(auth), **got}
