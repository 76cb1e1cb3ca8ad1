"""`tiered groups list|describe|delete`: the consumer groups' committed offsets in the bucket
(docs/kafka-api.md, "Group tools"), the same state the Kafka endpoint's ListGroups,
DescribeGroups and DeleteGroups act on, read without a running daemon.

Exit status: 0 on success; 7 when a named group has no committed offsets in the bucket (the
others named are still described or deleted); 2 for a bad configuration or group id; 3 for a
corrupt offsets object; 5 for store failures.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tiered.cli.options import ErrorGroup, config_option, json_option

if TYPE_CHECKING:
    from tiered.store.base import ObjectStore

log = logging.getLogger("tiered.groups")


@click.group("groups", cls=ErrorGroup)
def groups_group() -> None:
    """List, describe and delete consumer groups' committed offsets in the bucket."""


@contextmanager
def _store(config_path: Path) -> Iterator[ObjectStore]:
    from tiered.config import load_config
    from tiered.store import open_store

    config = load_config(config_path)
    # reads, and unconditional deletes: no conditional-write probe needed
    with open_store(config.store_settings(), probe=False) as store:
        yield store


def _when(ms_or_s: float, *, ms: bool) -> str:
    seconds = ms_or_s / 1000 if ms else ms_or_s
    if seconds < 0:
        return "unknown"
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(
        timespec="seconds").replace("+00:00", "Z")


@groups_group.command("list")
@config_option
@json_option
def groups_list(config_path: Path, as_json: bool) -> None:
    """Every group with committed offsets in the bucket (one listing of the bucket)."""
    from manifests.group_offsets import iter_group_objects

    with _store(config_path) as store:
        rows = [{"group": group, "bytes": info.size,
                 "last_modified": _when(info.last_modified, ms=False)}
                for group, info in iter_group_objects(store)]
    rows.sort(key=lambda r: str(r["group"]))
    if as_json:
        click.echo(json.dumps({"groups": rows}, indent=2))
        return
    if not rows:
        click.echo("no consumer group has committed offsets in the bucket")
        return
    width = max(len("GROUP"), *(len(str(r["group"])) for r in rows))
    click.echo(f"{'GROUP':<{width}}  {'LAST COMMIT':<20}  BYTES")
    for r in rows:
        click.echo(f"{r['group']:<{width}}  {r['last_modified']:<20}  {r['bytes']}")


@groups_group.command("describe")
@config_option
@json_option
@click.argument("group_ids", metavar="GROUP...", nargs=-1, required=True)
def groups_describe(config_path: Path, as_json: bool, group_ids: tuple[str, ...]) -> None:
    """The committed offsets of each GROUP: partition, offset, leader epoch, metadata and
    when it was committed."""
    from manifests.group_offsets import UnknownGroup, load_group_offsets

    found: list[dict[str, Any]] = []
    missing: list[str] = []
    with _store(config_path) as store:
        for group in group_ids:
            offsets, version = load_group_offsets(store, group)
            if version is None:
                missing.append(group)
                continue
            found.append({"group": group, "offsets": [
                {"topic": t, "partition": p, "offset": c.offset, "leader_epoch": c.leader_epoch,
                 "metadata": c.metadata, "commit_timestamp": c.commit_timestamp}
                for (t, p), c in offsets.offsets.items()]})
    if as_json:
        click.echo(json.dumps({"groups": found, "missing": missing}, indent=2))
    else:
        for g in found:
            click.echo(f"group {g['group']}: {len(g['offsets'])} committed offset(s)")
            for o in g["offsets"]:
                meta = "" if not o["metadata"] else f"  {o['metadata']!r}"
                click.echo(f"  {o['topic']}-{o['partition']}  offset {o['offset']}  "
                           f"epoch {o['leader_epoch']}  committed "
                           f"{_when(o['commit_timestamp'], ms=True)}{meta}")
    if missing:
        raise UnknownGroup("no committed offsets in the bucket for group(s) "
                           + ", ".join(repr(g) for g in missing))


@groups_group.command("delete")
@config_option
@json_option
@click.argument("group_ids", metavar="GROUP...", nargs=-1, required=True)
def groups_delete(config_path: Path, as_json: bool, group_ids: tuple[str, ...]) -> None:
    """Delete the committed offsets of each GROUP from the bucket.

    Stop the group's consumers first: the CLI cannot see a running endpoint's members, and a
    consumer still running commits again. A running endpoint's DeleteGroups (e.g. an admin
    client) refuses groups with members instead.
    """
    from manifests.group_offsets import UnknownGroup, delete_group

    deleted: list[str] = []
    missing: list[str] = []
    with _store(config_path) as store:
        for group in group_ids:
            if delete_group(store, group):
                deleted.append(group)
                log.info("group %r: committed offsets deleted", group)
            else:
                missing.append(group)
    if as_json:
        click.echo(json.dumps({"deleted": deleted, "missing": missing}, indent=2))
    else:
        for group in deleted:
            click.echo(f"deleted the committed offsets of group {group}")
    if missing:
        raise UnknownGroup("no committed offsets in the bucket for group(s) "
                           + ", ".join(repr(g) for g in missing))
