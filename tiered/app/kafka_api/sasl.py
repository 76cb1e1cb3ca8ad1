"""SaslHandshake (v0–1) and SaslAuthenticate (v0–2): SCRAM-SHA-256/512 with `scramp` against
the salted keys in the bucket, and PLAIN checked against the same keys (docs/security.md,
"Authentication").

The exchange is Kafka's: SaslHandshake picks a mechanism; then v1 wraps each SASL token in a
SaslAuthenticate request, while v0 (the legacy form) sends bare size-prefixed tokens
(`raw_token`). SCRAM takes two rounds (client-first -> server-first, client-final ->
server-final), PLAIN one. A failure answers SASL_AUTHENTICATION_FAILED, with a message that
never says whether the user exists, and the connection closes after it. With
`session_lifetime_ms` the answer carries the session's lifetime and the client re-authenticates
on the same connection before it ends (KIP-368); a re-authentication must prove the same
principal.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import scramp
from kio.schema.errors import ErrorCode

from manifests.security import User, check_password
from tiered.app.kafka_api.auth import ConnectionAuth, NotAuthenticated
from tiered.app.kafka_api.messages import build, response_class
from tiered.app.kafka_api.wire import FRAME_SIZE, Reply, Request

if TYPE_CHECKING:
    from tiered.app.kafka_api.context import Connection, Services

__all__ = ["handle_sasl_authenticate", "handle_sasl_handshake", "raw_token"]

log = logging.getLogger("tiered.app.kafka_api")

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
#: longest SASL token accepted (SCRAM's messages are a few hundred bytes)
MAX_TOKEN_BYTES = 8192
FAILED = "Authentication failed: invalid credentials with SASL mechanism {}"


class _Failed(Exception):
    """The client did not prove who it is (message for the log, never the client)."""


@dataclass
class _Scram:
    """One SCRAM exchange: scramp's server, fed the user's stored keys."""

    mechanism: str
    svc: Services
    name: str | None = None
    server: scramp.ScramServer | None = field(default=None, repr=False)

    def step(self, token: bytes) -> tuple[bytes, bool]:
        """The server's answer to `token`, and whether the exchange is complete."""
        try:
            text = token.decode("utf-8")
            if self.server is None:
                self.server = scramp.ScramMechanism(self.mechanism).make_server(self._keys)
                self.server.set_client_first(text)
                return self.server.get_server_first().encode(), False
            _accept_librdkafka_nonce(self.server, text)
            self.server.set_client_final(text)
            return self.server.get_server_final().encode(), True
        except (scramp.ScramException, UnicodeDecodeError) as exc:
            raise _Failed(f"{self.mechanism} for user {self.name!r}: {exc}") from None

    def _keys(self, name: str) -> tuple[bytes, bytes, bytes, int]:
        self.name = name
        user = _user(self.svc, name)
        c = None if user is None else user.credentials.get(self.mechanism)
        if c is None:
            raise scramp.ScramException("unknown user or no credential for the mechanism")
        return c.salt, c.stored_key, c.server_key, c.iterations


def _accept_librdkafka_nonce(server: scramp.ScramServer, client_final: str) -> None:
    """librdkafka before 2.6.1 (Debian's kcat among them) answers with its own nonce
    prepended once more to the server's (`r=<client nonce><client nonce><server nonce>`,
    librdkafka#4895). Kafka 3.8.1 to 3.9 accepted that form, as here: it still carries the
    whole server nonce, so a replayed exchange fails all the same, and the proof is checked
    over the message as the client sent it. Any other nonce is refused by scramp."""
    full = str(server.nonce)
    client_nonce = full[:len(full) - len(str(server.s_nonce))]
    sent = next((p[2:] for p in client_final.split(",") if p.startswith("r=")), None)
    if client_nonce and sent == client_nonce + full:
        server.nonce = type(server.nonce)(sent)  # scramp's Nonce


def _user(svc: Services, name: str) -> User | None:
    view = svc.guard.view
    return None if view is None else view.user(name)


def _plain(svc: Services, token: bytes) -> str:
    """The user PLAIN's `authzid NUL authcid NUL password` proves, or `_Failed`."""
    parts = token.split(b"\x00")
    if len(parts) != 3:
        raise _Failed("PLAIN: not authzid NUL user NUL password")
    try:
        authzid, name, password = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        raise _Failed("PLAIN: not UTF-8") from None
    if authzid and authzid != name:
        raise _Failed(f"PLAIN: user {name!r} asked to act as {authzid!r}")
    user = _user(svc, name)
    if user is None or not check_password(user, password):
        raise _Failed(f"PLAIN for user {name!r}: unknown user or wrong password")
    return name


def handle_sasl_handshake(svc: Services, conn: Connection, req: Request) -> Reply:
    cls = response_class(SASL_HANDSHAKE, req.api_version)
    enabled = svc.guard.security.sasl_mechanisms if svc.guard.enabled else ()
    auth = conn.auth
    asked = req.body.mechanism
    if asked not in enabled:
        return Reply.of(req.correlation_id, build(
            cls, error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=enabled))
    if auth.authenticated and req.api_version == 0:
        # re-authentication (KIP-368) needs SaslAuthenticate: v0's bare tokens cannot
        return Reply.of(req.correlation_id, build(
            cls, error_code=ErrorCode.illegal_sasl_state, mechanisms=enabled))
    auth.mechanism, auth.exchange = asked, None
    auth.raw_tokens = req.api_version == 0
    return Reply.of(req.correlation_id, build(cls, error_code=ErrorCode.none,
                                              mechanisms=enabled))


def handle_sasl_authenticate(svc: Services, conn: Connection, req: Request) -> Reply:
    cls = response_class(SASL_AUTHENTICATE, req.api_version)
    auth = conn.auth
    if auth.mechanism is None:
        auth.closing = True
        return Reply.of(req.correlation_id, build(
            cls, error_code=ErrorCode.illegal_sasl_state,
            error_message="SaslAuthenticate before SaslHandshake", auth_bytes=b""))
    try:
        answer, done = _step(svc, conn, bytes(req.body.auth_bytes))
    except _Failed as exc:
        log.warning("kafka: authentication from %s failed: %s", conn.peer_host, exc)
        mechanism = auth.mechanism
        _reset(auth)
        auth.closing = True
        return Reply.of(req.correlation_id, build(
            cls, error_code=ErrorCode.sasl_authentication_failed,
            error_message=FAILED.format(mechanism), auth_bytes=b""))
    lifetime_ms = svc.guard.security.session_lifetime_ms if done else 0
    return Reply.of(req.correlation_id, build(
        cls, error_code=ErrorCode.none, error_message=None, auth_bytes=answer,
        session_lifetime=datetime.timedelta(milliseconds=lifetime_ms)))


def raw_token(svc: Services, conn: Connection, frame: bytes) -> Reply:
    """One bare SASL token after SaslHandshake v0; a failure closes the connection without an
    answer, as Kafka does."""
    try:
        answer, _done = _step(svc, conn, frame)
    except _Failed as exc:
        log.warning("kafka: authentication from %s failed: %s", conn.peer_host, exc)
        raise NotAuthenticated(str(exc)) from None
    return Reply([FRAME_SIZE.pack(len(answer)) + answer])


def _step(svc: Services, conn: Connection, token: bytes) -> tuple[bytes, bool]:
    """Feed `token` to the exchange; on its completion the connection is authenticated."""
    auth = conn.auth
    mechanism = auth.mechanism
    assert mechanism is not None  # noqa: S101 - checked by the callers
    if len(token) > MAX_TOKEN_BYTES:
        raise _Failed(f"a SASL token of {len(token)} bytes")
    if mechanism == "PLAIN":
        name, answer, done = _plain(svc, token), b"", True
    else:
        if auth.exchange is None:
            auth.exchange = _Scram(mechanism, svc)
        answer, done = auth.exchange.step(token)
        name = auth.exchange.name
    if done:
        _complete(svc, auth, f"User:{name}")
    return answer, done


def _complete(svc: Services, auth: ConnectionAuth, principal: str) -> None:
    if auth.authenticated and principal != auth.principal:
        raise _Failed(f"re-authentication as {principal} on a connection of {auth.principal}")
    lifetime_ms = svc.guard.security.session_lifetime_ms
    first = not auth.authenticated
    auth.principal, auth.authenticated = principal, True
    auth.expires_at = svc.clock() + lifetime_ms / 1000 if lifetime_ms else None
    _reset(auth)
    if first:
        log.info("kafka: authenticated %s", principal)


def _reset(auth: ConnectionAuth) -> None:
    auth.mechanism, auth.exchange, auth.raw_tokens = None, None, False
