"""What every `tiered` command shares: the error-handling group class, logging set-up and the
common options. Subcommand modules import this, never `tiered.cli.main`, so the group can load
them on demand."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from tiered.errors import ConfigError, TieredError

#: libraries whose INFO chatter is noise on tiered's stderr
NOISY_LOGGERS = ("botocore", "boto3", "urllib3", "s3transfer", "py4j")


class ErrorGroup(click.Group):
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


def setup_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The TOML configuration file.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
