"""Who may use the HTTP API when `[http] auth = "basic"` (docs/security.md, "HTTP API"):
HTTP Basic credentials checked against the users in the bucket (the same SCRAM keys the
Kafka endpoint uses), then the ACLs: the records API needs READ on the topic in its path,
`/metrics` DESCRIBE on the cluster; `/health` stays open for probes. Refusals are 401 (with
`WWW-Authenticate`) or 403, with a JSON body like the records API's errors.

Checking a password costs one PBKDF2 (the user's iteration count); a consumer polling with
keep-alive would pay it on every request, so a successful check is remembered, keyed by a
process-secret HMAC of the credentials and valid while the user's stored keys are unchanged.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import ssl
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING
from urllib.parse import unquote

from manifests.security import Operation, User, check_password
from tiered.app.authz import Policy, Resource
from tiered.config.http import HttpConfig
from tiered.config.model import Config
from tiered.errors import ConfigError

if TYPE_CHECKING:
    from tiered.app.http_server import Response
    from tiered.app.security_view import SecurityView

__all__ = ["HttpGuard", "http_ssl_context", "policy_of"]

OPEN_PATHS = frozenset({"/health"})
_TOPIC = re.compile(r"/v1/topics/([^/]+)/")
#: successful checks remembered (users x clients polling at once)
REMEMBERED = 1024
_CHALLENGE = 'Basic realm="tiered", charset="UTF-8"'


def _refusal(status: int, name: str, message: str, *, challenge: bool = False) -> Response:
    headers = {"Content-Type": "application/json"}
    if challenge:
        headers["WWW-Authenticate"] = _CHALLENGE
    return status, headers, (json.dumps({"error": name, "message": message}) + "\n").encode()


class HttpGuard:
    """Thread-safe: HTTP threads call `check` at once."""

    def __init__(self, view: SecurityView) -> None:
        self.view = view
        self._secret = os.urandom(32)
        self._lock = threading.Lock()
        self._remembered: OrderedDict[bytes, User] = OrderedDict()

    def check(self, path: str, authorization: str | None, peer_host: str) -> Response | None:
        """None when the request may proceed, else the refusal to send."""
        if path in OPEN_PATHS:
            return None
        name = self._authenticate(authorization)
        if name is None:
            return _refusal(401, "UNAUTHENTICATED", "this endpoint needs HTTP Basic "
                            "credentials of a user in the bucket (`tiered users create`)",
                            challenge=True)
        principal = f"User:{name}"
        if path == "/metrics":
            if self.view.authorize(principal, peer_host, Operation.DESCRIBE, Resource.cluster()):
                return None
            return _refusal(403, "CLUSTER_AUTHORIZATION_FAILED",
                            f"{principal} may not describe the cluster (/metrics)")
        m = _TOPIC.match(path)
        if m is None:
            return None  # no topic named: the route answers (404 for an unknown path)
        topic = unquote(m.group(1))
        if self.view.authorize(principal, peer_host, Operation.READ, Resource.topic(topic)):
            return None
        return _refusal(403, "TOPIC_AUTHORIZATION_FAILED",
                        f"{principal} may not read topic {topic!r}")

    def _authenticate(self, header: str | None) -> str | None:
        """The user the Basic credentials prove, or None."""
        if header is None or header[:6].lower() != "basic ":
            return None
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            return None
        name, sep, password = decoded.partition(":")
        user = self.view.user(name) if sep else None
        if user is None:
            return None
        key = hmac.new(self._secret, decoded.encode(), hashlib.sha256).digest()
        with self._lock:
            known = self._remembered.get(key)
            if known is not None and known == user:
                self._remembered.move_to_end(key)
                return name
        if not check_password(user, password):
            return None
        with self._lock:
            self._remembered[key] = user
            while len(self._remembered) > REMEMBERED:
                self._remembered.popitem(last=False)
        return name


def http_ssl_context(http: HttpConfig) -> ssl.SSLContext | None:
    """The HTTPS context of `[http] tls_cert` / `tls_key` (and `tls_client_ca`: client
    certificates required); None for plain HTTP. `ConfigError` naming the key when a file
    does not load."""
    if http.tls_cert is None or http.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(http.tls_cert, http.tls_key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"[http] tls_cert / tls_key: cannot load {http.tls_cert} with "
                          f"{http.tls_key}: {exc}") from None
    if http.tls_client_ca is not None:
        try:
            context.load_verify_locations(cafile=http.tls_client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"[http] tls_client_ca: cannot load {http.tls_client_ca}: "
                              f"{exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def policy_of(config: Config) -> Policy:
    """The authorization settings both APIs apply: `[kafka] super_users` and
    `allow_everyone_if_no_acl` (their defaults without a [kafka] section)."""
    if config.kafka is None:
        return Policy()
    s = config.kafka.security
    return Policy(frozenset(s.super_users), s.allow_everyone_if_no_acl)
