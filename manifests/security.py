"""Users and ACLs in the bucket: who may connect to the Kafka endpoint and the HTTP API, and
what each principal may read (docs/security.md).

Two objects under `_tiered/security/`, each one JSON document changed by compare-and-swap
(`If-None-Match` to create it, `If-Match` on the version read to replace it), so every sidecar
and history server on the bucket sees one set and two administrators changing it at once both
land:

    users.json  {"version":1,"kind":"security_users","users":[
                   {"name":"alice","credentials":[{"mechanism":"SCRAM-SHA-512",
                    "salt":"<base64>","iterations":8192,"stored_key":"<base64>",
                    "server_key":"<base64>"}]}]}
    acls.json   {"version":1,"kind":"security_acls","acls":[
                   {"principal":"User:alice","resource_type":"topic","pattern_type":"literal",
                    "resource_name":"orders","operation":"read","permission":"allow",
                    "host":"*"}]}

A user holds SCRAM salted credentials (RFC 5802 / RFC 7677: salt, iteration count, StoredKey,
ServerKey), one per mechanism, derived by `scramp`; a password is never stored. PLAIN is checked
against the same keys (`check_password`). ACLs follow Kafka's model: principal `User:NAME` or
`User:*`, a topic, group or the cluster, a LITERAL or PREFIXED pattern, an operation, ALLOW or
DENY, and a host (`*`: any). The policy deciding a request lives in `tiered.app.authz`.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hmac
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import scramp

from manifests import keys
from manifests.cas import put_on_version, swap
from manifests.errors import CorruptManifest, ManifestError
from manifests.serde import load_document
from tiered.store.base import ObjectStore
from tiered.store.errors import ObjectNotFound

__all__ = [
    "CLUSTER_NAME",
    "MIN_ITERATIONS",
    "SCRAM_MECHANISMS",
    "Acl",
    "InvalidSecurityValue",
    "Operation",
    "PatternType",
    "Permission",
    "ResourceType",
    "ScramCredential",
    "User",
    "add_acl",
    "check_password",
    "decode_acls",
    "decode_users",
    "delete_user",
    "encode_acls",
    "encode_users",
    "load_acls",
    "load_users",
    "make_credential",
    "put_user",
    "remove_acls",
    "validate_principal",
    "validate_user_name",
]

KIND_USERS = "security_users"
KIND_ACLS = "security_acls"
SECURITY_VERSION = 1
#: RFC 7677's floor on the iteration count; fewer is refused when creating and when loading
MIN_ITERATIONS = 4096
#: a ceiling so a damaged bucket cannot make one authentication cost minutes
MAX_ITERATIONS = 10_000_000
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
#: the one cluster resource, as Kafka names it
CLUSTER_NAME = "kafka-cluster"
#: how long a change keeps retrying while another administrator changes the same object
CHANGE_DEADLINE_S = 10.0
MAX_NAME_CHARS = 255
_USER_FIELDS = ("name", "credentials")
_CRED_FIELDS = ("mechanism", "salt", "iterations", "stored_key", "server_key")
_ACL_FIELDS = ("principal", "resource_type", "pattern_type", "resource_name", "operation",
               "permission", "host")


class InvalidSecurityValue(ManifestError):
    """A user name, principal, mechanism or ACL field that cannot be stored."""

    exit_code = 2


class ResourceType(enum.StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"


class PatternType(enum.StrEnum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Operation(enum.StrEnum):
    """What an ACL grants or denies. READ implies DESCRIBE, ALL implies everything, as in
    Kafka; DELETE exists only as what a request needs (deleting a group), granted by ALL."""

    READ = "read"
    DESCRIBE = "describe"
    ALL = "all"
    DELETE = "delete"


#: the operations an ACL may name
ACL_OPERATIONS = (Operation.READ, Operation.DESCRIBE, Operation.ALL)


class Permission(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"


@dataclass(frozen=True)
class ScramCredential:
    """One mechanism's salted keys (RFC 5802 section 3): what SCRAM needs to verify a client
    and prove the server, and nothing from which the password is cheaply recovered."""

    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def __post_init__(self) -> None:
        if self.mechanism not in SCRAM_MECHANISMS:
            raise InvalidSecurityValue(f"unknown SCRAM mechanism {self.mechanism!r}; expected "
                                       f"{' or '.join(SCRAM_MECHANISMS)}")
        if type(self.iterations) is not int or not (
                MIN_ITERATIONS <= self.iterations <= MAX_ITERATIONS):
            raise InvalidSecurityValue(f"iterations must be {MIN_ITERATIONS}.."
                                       f"{MAX_ITERATIONS}, got {self.iterations!r}")
        if not self.salt or not self.stored_key or not self.server_key:
            raise InvalidSecurityValue("salt, stored_key and server_key must not be empty")


@dataclass(frozen=True)
class User:
    name: str
    #: mechanism -> credential
    credentials: Mapping[str, ScramCredential]

    def __post_init__(self) -> None:
        validate_user_name(self.name)
        for mechanism, c in self.credentials.items():
            if c.mechanism != mechanism:
                raise InvalidSecurityValue(f"user {self.name!r}: credential of {c.mechanism} "
                                           f"filed under {mechanism}")


@dataclass(frozen=True, order=True)
class Acl:
    """One ACL binding (Kafka's AclBinding): `principal` may (ALLOW) or may not (DENY) do
    `operation` on the resources of `resource_type` that `resource_name` names under
    `pattern_type`, from `host` (`*`: any)."""

    principal: str
    resource_type: ResourceType
    pattern_type: PatternType
    resource_name: str
    operation: Operation
    permission: Permission
    host: str = "*"

    def __post_init__(self) -> None:
        validate_principal(self.principal)
        for name, cls in (("resource_type", ResourceType), ("pattern_type", PatternType),
                          ("operation", Operation), ("permission", Permission)):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, cls(value))
            except ValueError:
                raise InvalidSecurityValue(
                    f"{name} must be one of {', '.join(m.value for m in cls)}, got "
                    f"{value!r}") from None
        if self.operation not in ACL_OPERATIONS:
            raise InvalidSecurityValue(f"operation must be read, describe or all, got "
                                       f"{self.operation.value!r}")
        if self.resource_type is ResourceType.CLUSTER and (
                self.resource_name != CLUSTER_NAME or self.pattern_type is PatternType.PREFIXED):
            raise InvalidSecurityValue(f"the cluster resource is the literal {CLUSTER_NAME!r}")
        _check_text(self.resource_name, "resource_name")
        _check_text(self.host, "host")

    def to_json(self) -> dict[str, str]:
        return {"principal": self.principal, "resource_type": self.resource_type.value,
                "pattern_type": self.pattern_type.value, "resource_name": self.resource_name,
                "operation": self.operation.value, "permission": self.permission.value,
                "host": self.host}


def _check_text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS or any(
            ord(ch) < 0x20 for ch in value):
        raise InvalidSecurityValue(f"{what} must be 1..{MAX_NAME_CHARS} printable characters, "
                                   f"got {value!r}")
    return value


def validate_user_name(name: object) -> str:
    """A user name SCRAM can carry: printable, no `,` or `=` (RFC 5802's saslname escapes
    them; keeping them out keeps one spelling per user), no `:`."""
    _check_text(name, "user name")
    assert isinstance(name, str)  # noqa: S101 - checked above
    if any(ch in name for ch in ",=:") or name != name.strip():
        raise InvalidSecurityValue(f"user name {name!r} must not contain ',', '=', ':' or "
                                   "surrounding spaces")
    return name


def validate_principal(principal: object) -> str:
    """`User:NAME` or the wildcard `User:*`."""
    if not isinstance(principal, str) or not principal.startswith("User:"):
        raise InvalidSecurityValue(f"a principal is User:NAME or User:*, got {principal!r}")
    name = principal[len("User:"):]
    if name != "*":
        _check_text(name, "principal name")
    return principal


# --- credentials --------------------------------------------------------------------------


def make_credential(password: str, mechanism: str, iterations: int = MIN_ITERATIONS,
                    salt: bytes | None = None) -> ScramCredential:
    """The salted keys of `password` for `mechanism` (a random salt unless given)."""
    if mechanism not in SCRAM_MECHANISMS:
        raise InvalidSecurityValue(f"unknown SCRAM mechanism {mechanism!r}; expected "
                                   f"{' or '.join(SCRAM_MECHANISMS)}")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise InvalidSecurityValue(f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}, "
                                   f"got {iterations}")
    salt_out, stored, server, count = scramp.ScramMechanism(mechanism).make_auth_info(
        password, iteration_count=iterations, salt=salt)
    return ScramCredential(mechanism, bytes(salt_out), int(count), bytes(stored), bytes(server))


def check_password(user: User, password: str) -> bool:
    """Whether `password` is the user's (SASL PLAIN, HTTP Basic): its keys computed with a
    stored credential's salt and iterations, compared in constant time. The strongest
    mechanism stored is used."""
    for mechanism in reversed(SCRAM_MECHANISMS):
        c = user.credentials.get(mechanism)
        if c is None:
            continue
        try:
            mine = make_credential(password, mechanism, c.iterations, c.salt)
        except scramp.ScramException:
            return False
        return hmac.compare_digest(mine.stored_key, c.stored_key) and hmac.compare_digest(
            mine.server_key, c.server_key)
    return False


# --- documents ----------------------------------------------------------------------------


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True, sort_keys=False).encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def encode_users(users: Iterable[User]) -> bytes:
    entries = [{"name": u.name, "credentials": [
        {"mechanism": c.mechanism, "salt": _b64(c.salt), "iterations": c.iterations,
         "stored_key": _b64(c.stored_key), "server_key": _b64(c.server_key)}
        for _, c in sorted(u.credentials.items())]} for u in sorted(users, key=lambda u: u.name)]
    return _dumps({"version": SECURITY_VERSION, "kind": KIND_USERS, "users": entries})


def encode_acls(acls: Iterable[Acl]) -> bytes:
    return _dumps({"version": SECURITY_VERSION, "kind": KIND_ACLS,
                   "acls": [a.to_json() for a in sorted(set(acls))]})


def _fields(obj: Any, fields: tuple[str, ...], where: str, key: str | None) -> dict[str, Any]:
    if not isinstance(obj, dict) or sorted(obj) != sorted(fields):
        raise CorruptManifest(f"{where} must have exactly the fields {', '.join(fields)}",
                              key=key)
    return obj


def _unb64(value: Any, where: str, key: str | None) -> bytes:
    if not isinstance(value, str) or len(value) > 4096:
        raise CorruptManifest(f"{where} must be a base64 string", key=key)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise CorruptManifest(f"{where} is not base64", key=key) from None


def decode_users(data: bytes, *, key: str | None = None) -> dict[str, User]:
    """Users by name; `CorruptManifest` for anything malformed."""
    doc = load_document(data, key, KIND_USERS, ("version", "kind", "users"),
                        newest=SECURITY_VERSION)
    if not isinstance(doc["users"], list):
        raise CorruptManifest("users must be a list", key=key)
    users: dict[str, User] = {}
    for i, entry in enumerate(doc["users"]):
        entry = _fields(entry, _USER_FIELDS, f"users[{i}]", key)
        if not isinstance(entry["credentials"], list):
            raise CorruptManifest(f"users[{i}].credentials must be a list", key=key)
        creds: dict[str, ScramCredential] = {}
        try:
            for j, c in enumerate(entry["credentials"]):
                where = f"users[{i}].credentials[{j}]"
                c = _fields(c, _CRED_FIELDS, where, key)
                cred = ScramCredential(c["mechanism"], _unb64(c["salt"], where, key),
                                       c["iterations"], _unb64(c["stored_key"], where, key),
                                       _unb64(c["server_key"], where, key))
                creds[cred.mechanism] = cred
            user = User(entry["name"], creds)
        except InvalidSecurityValue as exc:
            raise CorruptManifest(f"users[{i}]: {exc}", key=key) from None
        if user.name in users:
            raise CorruptManifest(f"user {user.name!r} is listed twice", key=key)
        users[user.name] = user
    return users


def decode_acls(data: bytes, *, key: str | None = None) -> tuple[Acl, ...]:
    """The ACLs, sorted; `CorruptManifest` for anything malformed."""
    doc = load_document(data, key, KIND_ACLS, ("version", "kind", "acls"),
                        newest=SECURITY_VERSION)
    if not isinstance(doc["acls"], list):
        raise CorruptManifest("acls must be a list", key=key)
    acls = []
    for i, entry in enumerate(doc["acls"]):
        entry = _fields(entry, _ACL_FIELDS, f"acls[{i}]", key)
        try:
            acls.append(Acl(**entry))
        except (InvalidSecurityValue, TypeError) as exc:
            raise CorruptManifest(f"acls[{i}]: {exc}", key=key) from None
    return tuple(sorted(set(acls)))


# --- reading and changing the bucket's set ------------------------------------------------

T = TypeVar("T")


def _load(store: ObjectStore, key: str, decode: Callable[..., T], empty: T
          ) -> tuple[T, str | None]:
    try:
        data = store.get(key)
    except ObjectNotFound:
        return empty, None
    return decode(data, key=key), data.etag


def load_users(store: ObjectStore) -> tuple[dict[str, User], str | None]:
    """The users and the object's version (None: no user was ever created)."""
    return _load(store, keys.SECURITY_USERS_KEY, decode_users, {})


def load_acls(store: ObjectStore) -> tuple[tuple[Acl, ...], str | None]:
    """The ACLs and the object's version (None: no ACL was ever added)."""
    return _load(store, keys.SECURITY_ACLS_KEY, decode_acls, ())


def put_user(store: ObjectStore, user: User, *, deadline_s: float = CHANGE_DEADLINE_S) -> bool:
    """Store `user` (replacing every credential of a user of that name: a new password);
    True when the user is new."""

    def attempt() -> bool:
        users, etag = load_users(store)
        new = user.name not in users
        users[user.name] = user
        put_on_version(store, keys.SECURITY_USERS_KEY, encode_users(users.values()), etag)
        return new

    return swap(attempt, key=keys.SECURITY_USERS_KEY, what="the users",
                deadline_s=deadline_s)


def delete_user(store: ObjectStore, name: str, *, deadline_s: float = CHANGE_DEADLINE_S
                ) -> bool:
    """Remove the user; False when there was none of that name. ACLs naming it stay."""

    def attempt() -> bool:
        users, etag = load_users(store)
        if name not in users or etag is None:
            return False
        del users[name]
        put_on_version(store, keys.SECURITY_USERS_KEY, encode_users(users.values()), etag)
        return True

    return swap(attempt, key=keys.SECURITY_USERS_KEY, what="the users",
                deadline_s=deadline_s)


def add_acl(store: ObjectStore, acl: Acl, *, deadline_s: float = CHANGE_DEADLINE_S) -> bool:
    """Add `acl`; False when the bucket holds it already."""

    def attempt() -> bool:
        acls, etag = load_acls(store)
        if acl in acls:
            return False
        put_on_version(store, keys.SECURITY_ACLS_KEY, encode_acls((*acls, acl)), etag)
        return True

    return swap(attempt, key=keys.SECURITY_ACLS_KEY, what="the ACLs",
                deadline_s=deadline_s)


def remove_acls(store: ObjectStore, matches: Callable[[Acl], bool], *,
                deadline_s: float = CHANGE_DEADLINE_S) -> tuple[Acl, ...]:
    """Remove every ACL `matches` accepts, decided on a fresh read; returns those removed."""

    def attempt() -> tuple[Acl, ...]:
        acls, etag = load_acls(store)
        gone = tuple(a for a in acls if matches(a))
        if gone and etag is not None:
            put_on_version(store, keys.SECURITY_ACLS_KEY,
                 encode_acls(a for a in acls if a not in gone), etag)
        return gone

    return swap(attempt, key=keys.SECURITY_ACLS_KEY, what="the ACLs",
                deadline_s=deadline_s)
