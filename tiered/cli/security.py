"""`tiered users create|list|delete` and `tiered acl add|list|remove`: the users and ACLs in the
bucket that every sidecar's Kafka endpoint and HTTP API enforce (docs/security.md, "The
CLI"). Changes are compare-and-swap on the bucket's objects; every sidecar applies them within
its refresh interval, without a restart.

Exit status: 0 on success; 2 for a bad configuration or value (user name, principal,
password, mechanism, iterations); 3 for a damaged users or ACLs object; 5 for store failures;
7 when the user or ACL to delete is not there.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tiered.cli.options import ErrorGroup, config_option, json_option
from tiered.errors import TieredError

if TYPE_CHECKING:
    from manifests.security import Acl
    from tiered.store.base import ObjectStore

log = logging.getLogger("tiered.security")

#: iterations of a new credential unless --iterations says otherwise (RFC 7677's floor is
#: 4096; more makes a guessed password costlier and every authentication a little slower)
DEFAULT_ITERATIONS = 8192
#: longest password read from standard input or a file
MAX_PASSWORD_CHARS = 1024


class NotThere(TieredError):
    """The user or ACL to remove is not in the bucket."""

    exit_code = 7


class BadValue(TieredError):
    exit_code = 2


@contextmanager
def _store(config_path: Path, *, writes: bool) -> Iterator[ObjectStore]:
    from tiered.config import load_config
    from tiered.store import open_store

    config = load_config(config_path)
    # a change is compare-and-swap: prove the store enforces conditional writes first
    with open_store(config.store_settings(), probe=writes) as store:
        yield store


# --- users ----------------------------------------------------------------------------------


@click.group("users", cls=ErrorGroup)
def users_group() -> None:
    """Create, list and delete the users of the Kafka endpoint and HTTP API (SCRAM keys)."""


def _read_password(password_file: Path | None) -> str:
    if password_file is not None:
        try:
            text = password_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise BadValue(f"--password-file {password_file}: cannot read it: {exc}") from None
    else:
        text = sys.stdin.readline()
    password = text[:-1] if text.endswith("\n") else text
    password = password[:-1] if password.endswith("\r") else password
    if not password:
        where = f"--password-file {password_file}" if password_file else "standard input"
        raise BadValue(f"no password on {where}: give it on the first line")
    if len(password) > MAX_PASSWORD_CHARS:
        raise BadValue(f"the password is longer than {MAX_PASSWORD_CHARS} characters")
    return password


@users_group.command("create")
@config_option
@json_option
@click.argument("name")
@click.option("--mechanism", "mechanisms", multiple=True,
              type=click.Choice(["SCRAM-SHA-256", "SCRAM-SHA-512"]),
              help="SCRAM mechanism to store keys for (repeatable). Default: both.")
@click.option("--iterations", type=int, default=DEFAULT_ITERATIONS, show_default=True,
              help="PBKDF2 iterations of the salted keys (at least 4096).")
@click.option("--password-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Read the password from this file's first line instead of standard input.")
def users_create(config_path: Path, as_json: bool, name: str, mechanisms: tuple[str, ...],
                 iterations: int, password_file: Path | None) -> None:
    """Create user NAME, or give it a new password, with the password read from standard
    input (or --password-file). Only SCRAM salted keys are stored, never the password."""
    from manifests.security import SCRAM_MECHANISMS, User, make_credential, put_user

    password = _read_password(password_file)
    chosen = mechanisms or SCRAM_MECHANISMS
    user = User(name, {m: make_credential(password, m, iterations) for m in chosen})
    with _store(config_path, writes=True) as store:
        new = put_user(store, user)
    log.info("user %r %s (%s)", name, "created" if new else "given a new password",
             ", ".join(sorted(chosen)))
    if as_json:
        click.echo(json.dumps({"user": name, "created": new, "mechanisms": sorted(chosen),
                               "iterations": iterations}, indent=2))
    else:
        click.echo(f"{'created' if new else 'updated'} user {name} "
                   f"({', '.join(sorted(chosen))}, {iterations} iterations)")


@users_group.command("list")
@config_option
@json_option
def users_list(config_path: Path, as_json: bool) -> None:
    """Every user with its mechanisms and iteration counts (no key material)."""
    from manifests.security import load_users

    with _store(config_path, writes=False) as store:
        users, _ = load_users(store)
    rows: list[dict[str, Any]] = [{"user": u.name, "mechanisms": [
        {"mechanism": c.mechanism, "iterations": c.iterations}
        for _, c in sorted(u.credentials.items())]} for _, u in sorted(users.items())]
    if as_json:
        click.echo(json.dumps({"users": rows}, indent=2))
        return
    if not rows:
        click.echo("no users in the bucket")
        return
    for r in rows:
        mechs = ", ".join(f"{m['mechanism']} ({m['iterations']} iterations)"
                          for m in r["mechanisms"])
        click.echo(f"{r['user']}  {mechs}")


@users_group.command("delete")
@config_option
@json_option
@click.argument("name")
def users_delete(config_path: Path, as_json: bool, name: str) -> None:
    """Delete user NAME (its ACLs stay: remove them with `tiered acl remove`). Connections
    already authenticated keep their session until it ends or `session_lifetime_ms` passes."""
    from manifests.security import delete_user

    with _store(config_path, writes=True) as store:
        deleted = delete_user(store, name)
    if as_json:
        click.echo(json.dumps({"user": name, "deleted": deleted}, indent=2))
    elif deleted:
        click.echo(f"deleted user {name}")
    if not deleted:
        raise NotThere(f"no user {name!r} in the bucket")


# --- ACLs -----------------------------------------------------------------------------------


@click.group("acl", cls=ErrorGroup)
def acl_group() -> None:
    """Add, list and remove ACLs (Kafka's model) in the bucket."""


def _selector_options(f: Any) -> Any:
    for option in reversed([
        click.option("--principal", required=True, help="User:NAME, or User:* for everyone."),
        click.option("--topic", help="A topic by name (* for every topic)."),
        click.option("--topic-prefix", help="Every topic whose name starts with this."),
        click.option("--group", help="A consumer group by id (* for every group)."),
        click.option("--group-prefix", help="Every group whose id starts with this."),
        click.option("--cluster", is_flag=True, help="The cluster (for /metrics)."),
        click.option("--operation", required=True,
                     type=click.Choice(["read", "describe", "all"], case_sensitive=False),
                     help="What is allowed (or denied): read implies describe."),
        click.option("--deny", is_flag=True, help="A DENY: wins over every ALLOW."),
        click.option("--host", default="*", show_default=True,
                     help="The client address it applies to (* for any)."),
    ]):
        f = option(f)
    return f


def _acl_of(principal: str, topic: str | None, topic_prefix: str | None, group: str | None,
            group_prefix: str | None, cluster: bool, operation: str, deny: bool,
            host: str) -> Acl:
    from manifests.security import (
        CLUSTER_NAME,
        Acl,
        Operation,
        PatternType,
        Permission,
        ResourceType,
    )

    chosen = [(kind, pattern, name) for kind, pattern, name in (
        ("topic", "literal", topic), ("topic", "prefixed", topic_prefix),
        ("group", "literal", group), ("group", "prefixed", group_prefix),
        ("cluster", "literal", CLUSTER_NAME if cluster else None)) if name is not None]
    if len(chosen) != 1:
        raise BadValue("name exactly one resource: --topic, --topic-prefix, --group, "
                       "--group-prefix or --cluster")
    kind, pattern, name = chosen[0]
    return Acl(principal, ResourceType(kind), PatternType(pattern), name,
               Operation(operation.lower()), Permission.DENY if deny else Permission.ALLOW,
               host)


def _row(a: Acl) -> dict[str, str]:
    return a.to_json()


@acl_group.command("add")
@config_option
@json_option
@_selector_options
def acl_add(config_path: Path, as_json: bool, **selector: Any) -> None:
    """Add an ACL: PRINCIPAL may (or, with --deny, may not) do OPERATION on the resource."""
    from manifests.security import add_acl

    acl = _acl_of(**selector)
    with _store(config_path, writes=True) as store:
        added = add_acl(store, acl)
    if as_json:
        click.echo(json.dumps({"added": added, "acl": _row(acl)}, indent=2))
    else:
        click.echo(("added: " if added else "already there: ") + _describe(acl))


@acl_group.command("remove")
@config_option
@json_option
@_selector_options
def acl_remove(config_path: Path, as_json: bool, **selector: Any) -> None:
    """Remove the ACL the options name (as given to `tiered acl add`)."""
    from manifests.security import remove_acls

    acl = _acl_of(**selector)
    with _store(config_path, writes=True) as store:
        removed = remove_acls(store, lambda a: a == acl)
    if as_json:
        click.echo(json.dumps({"removed": [_row(a) for a in removed]}, indent=2))
    else:
        for a in removed:
            click.echo("removed: " + _describe(a))
    if not removed:
        raise NotThere("no such ACL in the bucket: " + _describe(acl))


@acl_group.command("list")
@config_option
@json_option
@click.option("--principal", help="Only the ACLs of this principal.")
def acl_list(config_path: Path, as_json: bool, principal: str | None) -> None:
    """Every ACL in the bucket: what the Kafka endpoint's DescribeAcls answers too."""
    from manifests.security import load_acls

    with _store(config_path, writes=False) as store:
        acls, _ = load_acls(store)
    if principal is not None:
        acls = tuple(a for a in acls if a.principal == principal)
    if as_json:
        click.echo(json.dumps({"acls": [_row(a) for a in acls]}, indent=2))
        return
    if not acls:
        click.echo("no ACLs in the bucket")
        return
    for a in acls:
        click.echo(_describe(a))


def _describe(a: Acl) -> str:
    pattern = "prefixed " if a.pattern_type.value == "prefixed" else ""
    resource = ("the cluster" if a.resource_type.value == "cluster"
                else f"{pattern}{a.resource_type.value} {a.resource_name!r}")
    return (f"{a.principal} {a.permission.value.upper()} {a.operation.value} on {resource} "
            f"from host {a.host}")
