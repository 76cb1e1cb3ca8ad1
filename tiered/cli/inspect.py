"""`tiered config check` and `tiered log dump`: look at a configuration file or a Kafka log
file without touching the bucket."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from tiered.cli.options import ErrorGroup, config_option, json_option

# --- config ------------------------------------------------------------------------------


@click.group("config", cls=ErrorGroup)
def config_group() -> None:
    """Inspect and validate configuration files."""


def _echo_sections(effective: Mapping[str, Any]) -> None:
    """Print the effective configuration as TOML-like sections, values as JSON literals."""
    scalars = {k: v for k, v in effective.items() if not isinstance(v, Mapping)}
    for key, value in scalars.items():
        click.echo(f"{key} = {json.dumps(value, default=str)}")
    for name, section in effective.items():
        if not isinstance(section, Mapping):
            continue
        nested = {k: v for k, v in section.items() if isinstance(v, Mapping)}
        flat = {k: v for k, v in section.items() if not isinstance(v, Mapping)}
        if flat or not nested:
            click.echo(f"\n[{name}]")
            for key, value in flat.items():
                click.echo(f"{key} = {json.dumps(value, default=str)}")
        for sub, values in nested.items():
            click.echo(f'\n[{name}."{sub}"]')
            for key, value in values.items():
                click.echo(f'"{key}" = {json.dumps(value, default=str)}')


@config_group.command("check")
@config_option
@click.option("--skip-dir-check", is_flag=True,
              help="Do not require the [log] dirs to exist here (a file for another host).")
@json_option
def config_check(config_path: Path, skip_dir_check: bool, as_json: bool) -> None:
    """Validate FILE and print the effective configuration (secrets masked).

    Exits 0 when the file is valid, 2 with every problem listed when it is not. The [log]
    dirs must exist, as every command that reads the log requires.
    """
    from tiered.config import check_config

    effective, problems = check_config(config_path, check_dirs=not skip_dir_check)
    if problems or effective is None:
        if as_json:
            click.echo(json.dumps({"ok": False, "problems": problems}, indent=2))
        for problem in problems:
            click.echo(f"error: {problem}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps({"ok": True, "config": effective}, indent=2, default=str))
    else:
        _echo_sections(effective)


# --- log -----------------------------------------------------------------------------------


@click.group("log", cls=ErrorGroup)
def log_group() -> None:
    """Look inside Kafka log files."""


@log_group.command("dump")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--records", is_flag=True, help="Also print every record of every batch.")
@json_option
def log_dump(path: Path, records: bool, as_json: bool) -> None:
    """Dump a segment (.log), offset index (.index) or time index (.timeindex) file, or a
    bucket's index bundle (.indexes: each of its indexes in turn).

    Like kafka-dump-log.sh: one line per batch with offsets, count, timestamps, size and CRC
    status. Exits 1 when any batch fails its CRC or the file is truncated or malformed.
    """
    from tiered.kafka.dump import dump_file

    if path.name.endswith(".indexes"):
        reports = _dump_bundle(path)
    else:
        reports = [dump_file(path, records=records)]
    if as_json:
        docs = [r.to_json() for r in reports]
        click.echo(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    else:
        for report in reports:
            for line in report.lines():
                click.echo(line)
    if not all(r.ok for r in reports):
        sys.exit(1)


def _dump_bundle(path: Path) -> list[Any]:
    """Each offset and time index of a bundle downloaded from the bucket, dumped as the Kafka
    file it holds (offsets relative to the segment's base, from `{base}-{last}-{term}`). The
    transaction index is not a kind `log dump` reads."""
    import tempfile

    from manifests import keys, segment_indexes
    from tiered.errors import TieredError
    from tiered.kafka.dump import dump_file
    from tiered.kafka.segment import segment_file_name

    try:
        sections = segment_indexes.decode_bundle(path.read_bytes(), path=str(path))
    except OSError as err:
        raise TieredError(f"{path}: cannot read: {err.strerror or err}") from None
    parsed = keys.parse_segment_name(path.name.removesuffix(".indexes") + keys.SEGMENT_SUFFIX)
    base = parsed.base_offset if parsed is not None else 0
    reports = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("index", "timeindex"):
            data = sections.get(kind)
            if data is None:
                continue
            section = Path(tmp) / segment_file_name(base, f".{kind}")
            section.write_bytes(data)
            report = dump_file(section)
            report.path = Path(f"{path} ({kind})")
            reports.append(report)
    return reports
