"""Who a connection is and what it may do: the Kafka endpoint's side of docs/security.md.

* `Guard` is the endpoint's: whether clients must authenticate (SASL and/or a client
  certificate), the bucket's users and ACLs (`SecurityView`), and the decision for one
  request. Without `sasl_mechanisms` and `tls_client_ca` nobody authenticates and everything
  is allowed (the endpoint's behaviour before security existed).
* `ConnectionAuth` is one connection's: its principal, the SASL exchange in progress, when its
  session ends (KIP-368), and whether the connection closes after the answer being sent
  (a failed authentication).

The server calls three functions: `Guard.on_connect` once the TLS handshake is done,
`Guard.admit` before parsing each request, and looks at `ConnectionAuth.closing` after each
answer. Handlers ask `Guard.may`.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from manifests.security import Operation
from tiered.app.authz import ANONYMOUS, Policy, Resource
from tiered.app.kafka_api.wire import MalformedRequest
from tiered.config.security import KafkaSecurity, PrincipalRule

if TYPE_CHECKING:
    from tiered.app.security_view import SecurityView

__all__ = ["SASL_APIS", "ConnectionAuth", "Guard", "NotAuthenticated", "tls_principal"]

log = logging.getLogger("tiered.app.kafka_api")

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
#: what a connection may send before it authenticated
SASL_APIS = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})
#: subject attribute names as RFC 2253 spells them (what Kafka's principal rules match)
_DN_NAMES = {"commonName": "CN", "organizationalUnitName": "OU", "organizationName": "O",
             "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
             "streetAddress": "STREET", "domainComponent": "DC", "userId": "UID"}


class NotAuthenticated(MalformedRequest):
    """A request the connection may not send yet (or any more): the connection closes."""


@dataclass
class ConnectionAuth:
    """One connection's identity; changed only by its own thread."""

    principal: str = ANONYMOUS
    authenticated: bool = False
    #: the mechanism SaslHandshake chose, until SaslAuthenticate completes
    mechanism: str | None = None
    #: the mechanism's exchange in progress (`tiered.app.kafka_api.sasl`)
    exchange: Any = None
    #: SaslHandshake v0: the next frames are bare SASL tokens, not Kafka requests
    raw_tokens: bool = False
    #: monotonic time the session ends (KIP-368); None: never
    expires_at: float | None = None
    #: close the connection once the answer being sent is out
    closing: bool = False


def tls_principal(cert: dict[str, Any] | None, rules: tuple[PrincipalRule, ...]) -> str | None:
    """`User:<name>` from a verified peer certificate (`SSLSocket.getpeercert()`): the first
    of Kafka-style `rules` that matches its subject DN, or its CN. None without a name."""
    if not cert:
        return None
    rdns = [(_DN_NAMES.get(k, k), v) for rdn in cert.get("subject", ()) for k, v in rdn]
    cn = next((v for k, v in rdns if k == "CN"), None)
    dn = ",".join(f"{k}={_escape(v)}" for k, v in reversed(rdns))
    for rule in rules:
        if rule.pattern is None:
            return None if cn is None else f"User:{cn}"
        m = rule.pattern.fullmatch(dn)
        if m is None:
            continue
        name = m.expand(rule.replacement)
        name = name.lower() if rule.case == "L" else name.upper() if rule.case == "U" else name
        return f"User:{name}" if name else None
    return None if cn is None else f"User:{cn}"


def _escape(value: str) -> str:
    return "".join("\\" + ch if ch in ',+"\\<>;=' else ch for ch in value)


class Guard:
    """Authentication and authorization of one endpoint; thread-safe (the view is)."""

    def __init__(self, security: KafkaSecurity, view: SecurityView | None, *, tls: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.security = security
        self.view = view
        self.tls = tls
        self._clock = clock
        self.enabled = security.authenticates and view is not None

    @classmethod
    def open(cls) -> Guard:
        """Nobody authenticates, everything is allowed."""
        return cls(KafkaSecurity(), None, tls=False)

    @property
    def policy(self) -> Policy:
        return Policy(frozenset(self.security.super_users),
                      self.security.allow_everyone_if_no_acl)

    def on_connect(self, auth: ConnectionAuth, sock: Any) -> None:
        """After the TLS handshake: a client certificate names the principal (mutual TLS).
        With SASL on too, SASL's principal replaces it."""
        if not self.enabled or self.security.tls_client_ca is None:
            return
        if not isinstance(sock, ssl.SSLSocket):
            return
        principal = tls_principal(sock.getpeercert(), self.security.tls_principal_rules)
        if principal is None:
            raise NotAuthenticated("the client certificate names no principal (no CN and "
                                   "no tls_principal_rule matched)")
        auth.principal = principal
        auth.authenticated = not self.security.sasl_mechanisms

    def admit(self, auth: ConnectionAuth, api_key: int) -> None:
        """Raise `NotAuthenticated` (the connection closes) for a request other than
        ApiVersions and SASL before authentication, or after the session ended."""
        if not self.enabled or api_key in SASL_APIS:
            return
        if not auth.authenticated:
            raise NotAuthenticated(f"API key {api_key} before authenticating with SASL "
                                   f"({', '.join(self.security.sasl_mechanisms)})")
        if auth.expires_at is not None and self._clock() >= auth.expires_at:
            raise NotAuthenticated(f"the SASL session of {auth.principal} expired "
                                   "(session_lifetime_ms) and it did not re-authenticate")

    def topic(self, conn: Any, operation: Operation, name: str) -> bool:
        """Whether connection `conn` may do `operation` on topic `name`."""
        return self.may(conn.auth, conn.peer_host, operation, Resource.topic(name))

    def group(self, conn: Any, operation: Operation, group_id: str) -> bool:
        return self.may(conn.auth, conn.peer_host, operation, Resource.group(group_id))

    def cluster(self, conn: Any, operation: Operation) -> bool:
        return self.may(conn.auth, conn.peer_host, operation, Resource.cluster())

    def may(self, auth: ConnectionAuth, host: str, operation: Operation,
            resource: Resource) -> bool:
        if not self.enabled:
            return True
        assert self.view is not None  # noqa: S101 - enabled means a view
        allowed = self.view.authorize(auth.principal, host, operation, resource)
        if not allowed:
            log.debug("kafka: %s from %s may not %s %s %r", auth.principal, host,
                      operation.value, resource.type.value, resource.name)
        return allowed
