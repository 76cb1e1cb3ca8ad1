"""Users and ACLs in the bucket: SCRAM salted keys (never a password) that PLAIN checks
against too, a strict format, and changes by compare-and-swap so two administrators changing
the set at once both land (on every store backend)."""

from __future__ import annotations

import threading

import pytest
import scramp

from manifests import keys
from manifests.errors import CorruptManifest
from manifests.security import (
    Acl,
    InvalidSecurityValue,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    User,
    add_acl,
    check_password,
    decode_acls,
    decode_users,
    delete_user,
    encode_users,
    load_acls,
    load_users,
    make_credential,
    put_user,
    remove_acls,
)
from tiered.store.base import ObjectStore


def _acl(principal: str = "User:alice", name: str = "orders", **kw: object) -> Acl:
    fields: dict[str, object] = {"resource_type": "topic", "pattern_type": "literal",
                                 "operation": "read", "permission": "allow", "host": "*"}
    fields.update(kw)
    return Acl(principal, resource_name=name, **fields)  # type: ignore[arg-type]


def test_credentials_are_rfc5802_keys_and_never_the_password() -> None:
    password = "correct horse battery staple"
    c = make_credential(password, "SCRAM-SHA-512", 4096)
    data = encode_users([User("alice", {c.mechanism: c})])
    assert password.encode() not in data
    assert len(c.stored_key) == len(c.server_key) == 64 and len(c.salt) >= 16
    # a real SCRAM exchange with scramp's client succeeds against the stored keys
    m = scramp.ScramMechanism("SCRAM-SHA-512")
    server = m.make_server(lambda _user: (c.salt, c.stored_key, c.server_key, c.iterations))
    client = scramp.ScramClient(["SCRAM-SHA-512"], "alice", password)
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    server.set_client_final(client.get_client_final())
    client.set_server_final(server.get_server_final())
    user = decode_users(data)["alice"]
    assert check_password(user, password)
    assert not check_password(user, password + "!")
    assert not check_password(User("bob", {}), password)


def test_fewer_than_4096_iterations_are_refused() -> None:
    with pytest.raises(InvalidSecurityValue, match="iterations"):
        make_credential("pw", "SCRAM-SHA-256", 4095)
    with pytest.raises(InvalidSecurityValue, match="mechanism"):
        make_credential("pw", "PLAIN")


@pytest.mark.parametrize("doc", [
    b'{"version":1,"kind":"security_users"}',
    b'{"version":1,"kind":"security_users","users":[{"name":"a","credentials":[{"mechanism":'
    b'"SCRAM-SHA-256","salt":"AA==","iterations":10,"stored_key":"AA==","server_key":"AA=="}]}]}',
    b'{"version":1,"kind":"security_users","users":[{"name":"a,b","credentials":[]}]}',
    b'{"version":1,"kind":"security_users","users":[{"name":"a","credentials":[{"mechanism":'
    b'"SCRAM-SHA-256","salt":"!!","iterations":4096,"stored_key":"AA==","server_key":"AA=="}]}]}',
    b'{"version":2,"kind":"security_users","users":[]}',
])
def test_damaged_users_are_refused(doc: bytes) -> None:
    with pytest.raises(CorruptManifest):
        decode_users(doc)


@pytest.mark.parametrize("doc", [
    b'{"version":1,"kind":"security_acls","acls":[{"principal":"alice","resource_type":"topic",'
    b'"pattern_type":"literal","resource_name":"t","operation":"read","permission":"allow",'
    b'"host":"*"}]}',
    b'{"version":1,"kind":"security_acls","acls":[{"principal":"User:a","resource_type":"topic",'
    b'"pattern_type":"literal","resource_name":"t","operation":"write","permission":"allow",'
    b'"host":"*"}]}',
    b'{"version":1,"kind":"security_acls","acls":[{"principal":"User:a"}]}',
])
def test_damaged_acls_are_refused(doc: bytes) -> None:
    with pytest.raises(CorruptManifest):
        decode_acls(doc)


def test_acl_fields_are_kafkas_model() -> None:
    a = _acl(pattern_type="prefixed", name="orders.", permission="deny", host="10.0.0.1")
    assert a.pattern_type is PatternType.PREFIXED and a.permission is Permission.DENY
    assert _acl(principal="User:*").principal == "User:*"
    with pytest.raises(InvalidSecurityValue):
        _acl(resource_type="cluster", name="orders")
    assert _acl(resource_type="cluster", name="kafka-cluster",
                operation="describe").resource_type is ResourceType.CLUSTER
    with pytest.raises(InvalidSecurityValue):
        _acl(operation="delete")


def test_users_and_acls_change_by_compare_and_swap(store: ObjectStore) -> None:
    assert load_users(store) == ({}, None) and load_acls(store) == ((), None)
    c = make_credential("pw", "SCRAM-SHA-256")
    assert put_user(store, User("alice", {c.mechanism: c}))
    assert not put_user(store, User("alice", {c.mechanism: c}))  # replaced, not new
    assert keys.SECURITY_USERS_KEY == "_tiered/security/users.json"
    assert list(load_users(store)[0]) == ["alice"]
    assert add_acl(store, _acl()) and not add_acl(store, _acl())
    assert load_acls(store)[0] == (_acl(),)
    assert remove_acls(store, lambda a: a.operation is Operation.READ) == (_acl(),)
    assert load_acls(store)[0] == ()
    assert delete_user(store, "alice") and not delete_user(store, "alice")


def test_concurrent_administrators_both_land(store: ObjectStore) -> None:
    acls = [_acl(principal=f"User:u{i}") for i in range(8)]
    threads = [threading.Thread(target=add_acl, args=(store, a)) for a in acls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(load_acls(store)[0]) == sorted(acls)
