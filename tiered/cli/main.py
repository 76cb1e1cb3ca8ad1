"""The `tiered` command line.

Every command prints for humans by default and JSON with `--json`; exit status is 0 only on
success. A `TieredError` (bad config, corrupt file, unreachable bucket) becomes one clear line on
stderr and the error's exit code, never a traceback; an unexpected exception still shows one,
because that is a bug to report.
"""

from __future__ import annotations

import gc
import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from tiered import __version__
from tiered.errors import ConfigError, TieredError

log = logging.getLogger("tiered")


class _Group(click.Group):
    """A click group that turns domain errors into a message and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            for problem in exc.problems:
                click.echo(f"error: {problem}", err=True)
            ctx.exit(exc.exit_code)
        except TieredError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)


def _setup_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # boto's own chatter is noise at INFO
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "py4j"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The TOML configuration file.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tiered")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
def cli(verbose: int, quiet: bool) -> None:
    """tiered: tiered storage for Kafka-format logs.

    Uploads closed log segments to S3-compatible object storage, serves reads of data that has
    left the local disk, and runs maintenance on the bucket.
    """
    _setup_logging(verbose, quiet)


# --- config ------------------------------------------------------------------------------


@cli.group("config", cls=_Group)
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
@json_option
def config_check(config_path: Path, as_json: bool) -> None:
    """Validate FILE and print the effective configuration (secrets masked).

    Exits 0 when the file is valid, 2 with every problem listed when it is not.
    """
    from tiered.config import check_config

    effective, problems = check_config(config_path)
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


@cli.group("log", cls=_Group)
def log_group() -> None:
    """Look inside Kafka log files."""


@log_group.command("dump")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--records", is_flag=True, help="Also print every record of every batch.")
@json_option
def log_dump(path: Path, records: bool, as_json: bool) -> None:
    """Dump a segment (.log), offset index (.index) or time index (.timeindex) file.

    Like kafka-dump-log.sh: one line per batch with offsets, count, timestamps, size and CRC
    status. Exits 1 when any batch fails its CRC or the file is truncated or malformed.
    """
    from tiered.kafka.dump import dump_file

    report = dump_file(path, records=records)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        for line in report.lines():
            click.echo(line)
    if not report.ok:
        sys.exit(1)

# Commands defined elsewhere register themselves on `cli` when imported.
import tiered.cli.commands  # noqa: E402,F401 - run, archive, describe-storage, demo
import tiered.cli.fetch  # noqa: E402,F401 - fetch
import tiered.cli.spark  # noqa: E402,F401 - merge, recover, scrub


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (`argv`: the arguments, default the process's)."""
    try:
        cli.main(args=argv, prog_name="tiered")
    finally:
        # the process ends here: take every object out of the collector's sight, so the
        # interpreter's final collection does not walk them all (0.1 s after an upload pass,
        # over 1% of `archive --once` on the upload benchmark). Files and logs are closed by
        # then (context managers, atexit), so nothing waits on a finalizer.
        gc.freeze()


if __name__ == "__main__":
    # `python -m tiered.cli.main` runs this file as __main__, a second copy of the module: the
    # commands registered themselves on `tiered.cli.main.cli`, so run that one.
    from tiered.cli.main import main as _main

    _main()
