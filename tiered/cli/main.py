"""The `tiered` command line.

Every command prints for humans by default and JSON with `--json`; exit status is 0 only on
success. A `TieredError` (bad config, corrupt file, unreachable bucket) becomes one clear line on
stderr and the error's exit code, never a traceback; an unexpected exception still shows one,
because that is a bug to report.
"""

from __future__ import annotations

import gc
import importlib

import click

from tiered import __version__
from tiered.cli.options import ErrorGroup, setup_logging

#: every subcommand: name -> ("module:attribute", short help). The group imports a module only
#: when its command runs (or its own --help is asked for): `tiered --help` and a local fetch do
#: not load boto3, and only compact, merge, recover and scrub load Spark. The short help is repeated
#: here so `tiered --help` need not import anything; a test keeps it equal to each command's.
COMMANDS: dict[str, tuple[str, str]] = {
    "acl": ("tiered.cli.security:acl_group",
        "Add, list and remove ACLs (Kafka's model) in the bucket."),
    "archive": ("tiered.cli.commands:archive_command",
        "One full archiving pass: upload every eligible segment, commit manifests, apply "
        "remote and local retention, collect garbage."),
    "bucket": ("tiered.cli.bucket:bucket_group",
        "Manage the bucket a configuration names."),
    "compact": ("tiered.cli.spark:compact_command",
        "Compact the history of compacted topics in the bucket (Kafka's log cleaner), on "
        "Spark."),
    "config": ("tiered.cli.inspect:config_group",
        "Inspect and validate configuration files."),
    "demo": ("tiered.cli.commands:demo_command",
        "Write a sample topic, archive it to a local-directory bucket, trim local "
        "retention, and show what is local and what is remote."),
    "describe-storage": ("tiered.cli.commands:describe_storage_command",
        "Per partition: what is on local disk, what is in the bucket, what waits for "
        "upload, and the offset below which local deletion is safe."),
    "fetch": ("tiered.cli.fetch:fetch_command",
        "Fetch record batches of TOPIC/PARTITION starting at OFFSET (or at TIMESTAMP)."),
    "groups": ("tiered.cli.groups:groups_group",
        "List, describe and delete consumer groups' committed offsets in the bucket."),
    "log": ("tiered.cli.inspect:log_group",
        "Look inside Kafka log files."),
    "merge": ("tiered.cli.spark:merge_command",
        "Merge runs of small adjacent segments in the bucket into larger ones (Redpanda's "
        "adjacent segment merging), on Spark."),
    "recover": ("tiered.cli.spark:recover_command",
        "Recreate a topic's Kafka log directory from the bucket, or (--rebuild-manifests) "
        "rebuild manifests from the segment objects."),
    "run": ("tiered.cli.commands:run_command",
        "Run the archiver daemon until SIGTERM or Ctrl-C."),
    "scrub": ("tiered.cli.spark:scrub_command",
        "Check every object the manifests name: present, right size and checksum, batch "
        "CRCs intact; find gaps, overlaps and orphans."),
    "users": ("tiered.cli.security:users_group",
        "Create, list and delete the users of the Kafka endpoint and HTTP API (SCRAM keys)."),
}


def load_command(name: str) -> click.Command:
    """The command `name` of `COMMANDS`, importing its module."""
    module, _, attr = COMMANDS[name][0].partition(":")
    command = getattr(importlib.import_module(module), attr)
    assert isinstance(command, click.Command), f"{module}:{attr} is not a click command"
    return command


class LazyGroup(ErrorGroup):
    """The `tiered` group: subcommands from `COMMANDS`, imported when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return load_command(cmd_name) if cmd_name in COMMANDS else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, help_) in sorted(COMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tiered")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
def cli(verbose: int, quiet: bool) -> None:
    """tiered: tiered storage for Kafka-format logs.

    Uploads closed log segments to S3-compatible object storage, serves reads of data that has
    left the local disk, and runs maintenance on the bucket.
    """
    setup_logging(verbose, quiet)


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
