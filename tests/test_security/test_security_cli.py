"""`tiered users` and `tiered acl` against a bucket: the password from standard input or a
file and only SCRAM keys stored, the exact flags of the contract, --json, and clear errors
with the documented exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from manifests.security import check_password, load_acls, load_users
from tiered.cli.main import cli
from tiered.store import open_store
from tiered.store.base import ObjectStore, StoreSettings


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tiered.toml"
    path.write_text(f'[storage]\nurl = "{(tmp_path / "bucket").as_uri()}"\n')
    return path


def _bucket(config: Path) -> ObjectStore:
    return open_store(StoreSettings(url=(config.parent / "bucket").as_uri()), probe=False)


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_users_create_list_delete(config: Path, tmp_path: Path) -> None:
    code, out, _ = run("users", "create", "alice", "--config", str(config),
                       "--mechanism", "SCRAM-SHA-512", "--iterations", "4096",
                       stdin="s3cret pass\n")
    assert code == 0 and "created user alice" in out
    (tmp_path / "pw").write_text("other\n")
    code, out, _ = run("users", "create", "bob", "--config", str(config), "--password-file",
                       str(tmp_path / "pw"), "--json")
    assert code == 0 and json.loads(out)["mechanisms"] == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    with _bucket(config) as store:
        users, _ = load_users(store)
        raw = store.get("_tiered/security/users.json")
    assert check_password(users["alice"], "s3cret pass") and check_password(users["bob"], "other")
    assert list(users["alice"].credentials) == ["SCRAM-SHA-512"]
    assert b"s3cret" not in raw and b"other" not in raw
    code, out, _ = run("users", "list", "--config", str(config), "--json")
    assert [u["user"] for u in json.loads(out)["users"]] == ["alice", "bob"]
    code, out, _ = run("users", "list", "--config", str(config))
    assert "alice  SCRAM-SHA-512 (4096 iterations)" in out
    assert run("users", "delete", "bob", "--config", str(config))[0] == 0
    code, _, err = run("users", "delete", "bob", "--config", str(config))
    assert code == 7 and "no user 'bob'" in err


@pytest.mark.parametrize(("args", "stdin", "message"), [
    (["--iterations", "100"], "pw\n", "iterations"),
    ([], "\n", "no password"),
    (["--mechanism", "PLAIN"], "pw\n", "PLAIN"),
])
def test_users_create_refuses_bad_values(config: Path, args: list[str], stdin: str,
                                         message: str) -> None:
    code, _, err = run("users", "create", "alice", "--config", str(config), *args, stdin=stdin)
    assert code == 2 and message in err and "Traceback" not in err


def test_a_bad_user_name_is_a_clear_error(config: Path) -> None:
    code, _, err = run("users", "create", "a,b", "--config", str(config), stdin="pw\n")
    assert code == 2 and "user name" in err


def test_acl_add_list_remove(config: Path) -> None:
    base = ["--config", str(config)]
    assert run("acl", "add", *base, "--principal", "User:alice", "--topic", "orders",
               "--operation", "read")[0] == 0
    code, out, _ = run("acl", "add", *base, "--principal", "User:*", "--topic-prefix", "pub.",
                       "--operation", "describe", "--deny", "--host", "10.0.0.9")
    assert code == 0 and "User:* DENY describe on prefixed topic 'pub.'" in out
    assert run("acl", "add", *base, "--principal", "User:alice", "--group", "g",
               "--operation", "all")[0] == 0
    assert run("acl", "add", *base, "--principal", "User:ops", "--group-prefix", "app-",
               "--operation", "read")[0] == 0
    assert run("acl", "add", *base, "--principal", "User:ops", "--cluster",
               "--operation", "describe")[0] == 0
    code, out, _ = run("acl", "list", *base, "--json")
    acls = json.loads(out)["acls"]
    assert len(acls) == 5
    assert {"principal": "User:*", "resource_type": "topic", "pattern_type": "prefixed",
            "resource_name": "pub.", "operation": "describe", "permission": "deny",
            "host": "10.0.0.9"} in acls
    with _bucket(config) as store:
        assert len(load_acls(store)[0]) == 5
    code, out, _ = run("acl", "remove", *base, "--principal", "User:alice", "--topic", "orders",
                       "--operation", "read")
    assert code == 0 and "removed" in out
    code, _, err = run("acl", "remove", *base, "--principal", "User:alice", "--topic", "orders",
                       "--operation", "read")
    assert code == 7 and "no such ACL" in err
    listed = run("acl", "list", *base, "--principal", "User:alice")[1].splitlines()
    assert listed == ["User:alice ALLOW all on group 'g' from host *"]


@pytest.mark.parametrize(("args", "message"), [
    (["--principal", "alice", "--topic", "t", "--operation", "read"], "User:NAME"),
    (["--principal", "User:a", "--operation", "read"], "exactly one resource"),
    (["--principal", "User:a", "--topic", "t", "--group", "g", "--operation", "read"],
     "exactly one resource"),
])
def test_acl_add_refuses_bad_selectors(config: Path, args: list[str], message: str) -> None:
    code, _, err = run("acl", "add", "--config", str(config), *args)
    assert code == 2 and message in err and "Traceback" not in err
