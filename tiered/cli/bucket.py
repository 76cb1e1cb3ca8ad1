"""`tiered bucket create`: make the bucket a configuration names, for users without the dev
stack (whose compose file creates it) or an `aws s3 mb` at hand."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tiered.cli.options import ErrorGroup, config_option, json_option


@click.group("bucket", cls=ErrorGroup)
def bucket_group() -> None:
    """Manage the bucket a configuration names."""


@bucket_group.command("create")
@config_option
@json_option
def bucket_create(config_path: Path, as_json: bool) -> None:
    """Create the bucket of FILE's [storage] url (a directory for file://).

    Exits 0 when the bucket exists afterwards, created now or already there.
    """
    from tiered.config import load_config
    from tiered.store import open_store

    config = load_config(config_path)
    settings = config.store_settings()
    # no conditional-write probe: it needs the very bucket this makes
    with open_store(settings, probe=False) as store:
        created = store.create_bucket()
    where = settings.url + (f" at {settings.endpoint_url}" if settings.endpoint_url else "")
    if as_json:
        click.echo(json.dumps({"url": settings.url, "created": created}))
    else:
        click.echo(f"created the bucket {where}" if created
                   else f"the bucket {where} already exists")
