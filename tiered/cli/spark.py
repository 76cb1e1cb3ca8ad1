"""`tiered compact`, `tiered merge`, `tiered recover` and `tiered scrub`: the Spark maintenance
commands.

Registered on `tiered.cli.main.cli` by importing this module. The job modules (and pyspark) load
only inside the command bodies, so `tiered --help` and the daemon never need Spark, and a
missing `spark` extra is one line saying how to install it (`require_pyspark`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from spark_jobs.job_context import JobContext, emit_summary
from tiered.cli.options import config_option, json_option
from tiered.config.units import UnitError, format_size, parse_size

master_option = click.option(
    "--master",
    default=None,
    metavar="URL",
    help="Spark master (local[*], spark://host:7077, ...). Default: what spark-submit set, "
    "else local[*].",
)


def _context(config_path: Path, master: str | None, app_name: str) -> JobContext:
    from spark_jobs.session import require_pyspark

    require_pyspark()
    return JobContext.from_config_path(config_path, master=master, app_name=app_name)


class _Size(click.ParamType):
    """A byte count: `1048576`, `512MiB`, `2GB`."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(value.strip() if isinstance(value, str) else value)
        except UnitError as exc:
            self.fail(str(exc), param, ctx)


def _skipped_and_errors(summary: dict[str, Any]) -> Iterable[str]:
    """The closing lines of a merge or compaction summary: partitions left alone, and why,
    then what failed (the two jobs report both in the same fields)."""
    for skip in summary["skipped"]:
        yield f"  skipped {skip['topic']}/{skip['partition']}: {skip['reason']}"
    for err in summary["errors"]:
        yield f"error: {err}"


# -- merge -------------------------------------------------------------------------------------


def merge_lines(summary: dict[str, Any]) -> Iterable[str]:
    if summary.get("disabled"):
        yield summary["message"]
        return
    before, after = summary["before"], summary["after"]
    yield (
        f"segments: {before['segments']} -> {after['segments']} "
        f"({format_size(before['bytes'])} -> {format_size(after['bytes'])})"
    )
    yield (
        f"merged {summary['runs_committed']} run(s) into new segments, re-uploaded "
        f"{format_size(summary['bytes_uploaded'])} in {summary['elapsed_s']:.1f} s"
    )
    for p in summary["partitions"]:
        if p["runs_committed"]:
            yield (
                f"  {p['topic']}/{p['partition']}: {p['segments_before']} -> "
                f"{p['segments_after']} segments"
            )
    yield from _skipped_and_errors(summary)


@click.command("merge")
@config_option
@click.option("--topic", default=None, help="Only this topic (default: every topic).")
@master_option
@click.option("--force", is_flag=True,
              help="Merge even when cloud_storage_enable_segment_merging is false.")
@json_option
def merge_command(
    config_path: Path, topic: str | None, master: str | None, force: bool, as_json: bool
) -> None:
    """Merge runs of small adjacent segments in the bucket into larger ones (Redpanda's adjacent
    segment merging), on Spark.

    Merged segments grow up to cloud_storage_segment_size_target (default: the topic's
    segment.bytes); segments below cloud_storage_segment_size_min (default: half of it) are
    candidates. Each partition's manifest is updated by compare-and-swap; the old objects are
    deleted by garbage collection after the grace period. Exits 1 if any run failed."""
    from spark_jobs.merge import disabled_summary, run_merge
    from tiered.config import load_config

    # switched off: say so without starting Spark or touching the bucket
    off = disabled_summary(load_config(config_path), force=force)
    if off is not None:
        emit_summary(off, as_json=as_json, human=merge_lines)
        return
    with _context(config_path, master, "tiered-merge") as ctx:
        summary = run_merge(ctx, topic=topic, force=force)
    emit_summary(summary, as_json=as_json, human=merge_lines)


# -- compact -----------------------------------------------------------------------------------


def compact_lines(summary: dict[str, Any]) -> Iterable[str]:
    before, after = summary["before"]["bytes"], summary["after"]["bytes"]
    verb = "would compact" if summary["dry_run"] else "compacted"
    yield (
        f"{verb} {len(summary['partitions'])} partition(s): {format_size(before)} -> "
        f"{format_size(after)}; read {format_size(summary['bytes_read'])} in "
        f"{summary['elapsed_s']:.1f} s ({summary['mb_per_s']} MB/s)"
    )
    yield (
        f"records dropped {summary['records_dropped']} of {summary['records_in']}, tombstones "
        f"dropped {summary['tombstones_dropped']}, keyless records kept "
        f"{summary['keyless_records_kept']}, delete horizons set "
        f"{summary['delete_horizons_set']}; {summary['objects_written']} object(s) written "
        f"for {summary['segments_replaced']} segment(s)"
    )
    for p in summary["partitions"]:
        yield (
            f"  {p['topic']}/{p['partition']}: dirty ratio {p['dirty_ratio']}, "
            f"{format_size(p['bytes_before'])} -> {format_size(p['bytes_after'])}, "
            f"{p['records_dropped']} records and {p['tombstones_dropped']} tombstones dropped"
        )
    yield from _skipped_and_errors(summary)


@click.command("compact")
@config_option
@click.option("--topic", default=None, help="Only this topic (default: every compacted topic).")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="Only this partition (of --topic, or of every topic).")
@master_option
@click.option("--dry-run", is_flag=True,
              help="Read and clean, report what would change; upload and commit nothing.")
@click.option("--metrics-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the run's figures as Prometheus gauges to this file (for "
              "node_exporter's textfile collector).")
@json_option
def compact_command(
    config_path: Path, topic: str | None, partition: int | None, master: str | None,
    dry_run: bool, metrics_file: Path | None, as_json: bool,
) -> None:
    """Compact the history of compacted topics in the bucket (Kafka's log cleaner), on Spark.

    For every key the record with the highest offset survives at its own offset; tombstones
    go delete.retention.ms after the pass that first kept them; aborted transactions go.
    Partitions are compacted when due (min.cleanable.dirty.ratio, max.compaction.lag.ms);
    records younger than min.compaction.lag.ms are left alone. Replacements are committed by
    compare-and-swap and the old objects deleted by garbage collection after the grace
    period. Exits 1 if anything could not be compacted."""
    from spark_jobs.compact import run_compact, write_metrics

    with _context(config_path, master, "tiered-compact") as ctx:
        summary = run_compact(ctx, topic=topic, partition=partition, dry_run=dry_run)
    if metrics_file is not None:
        try:
            write_metrics(summary, str(metrics_file))
        except OSError as exc:
            raise click.ClickException(f"cannot write --metrics-file {metrics_file}: {exc}"
                                       ) from None
    emit_summary(summary, as_json=as_json, human=compact_lines)


# -- recover -----------------------------------------------------------------------------------


@click.command("recover")
@config_option
@click.option("--topic", default=None, help="The topic to recover (required with --log-dir).")
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Kafka log directory to recreate the topic's partitions in.")
@click.option("--max-bytes", type=_Size(), default=None,
              help="Only the newest N bytes per partition (default: everything).")
@click.option("--overwrite", is_flag=True,
              help="Move an existing partition directory aside (renamed as Kafka renames a deleted "
              "partition) instead of refusing to recover over it.")
@click.option("--rebuild-manifests", is_flag=True,
              help="Rebuild lost or corrupt manifests from the segment objects instead.")
@master_option
@json_option
def recover_command(
    config_path: Path,
    topic: str | None,
    log_dir: Path | None,
    max_bytes: int | None,
    overwrite: bool,
    rebuild_manifests: bool,
    master: str | None,
    as_json: bool,
) -> None:
    """Recreate a topic's Kafka log directory from the bucket, or (--rebuild-manifests)
    rebuild manifests from the segment objects. Exits 1 if anything could not be recovered."""
    if rebuild_manifests and (log_dir is not None or max_bytes is not None or overwrite):
        raise click.UsageError("--rebuild-manifests takes no --log-dir, --max-bytes or --overwrite")
    if not rebuild_manifests and (topic is None or log_dir is None):
        raise click.UsageError("recover needs --topic and --log-dir (or --rebuild-manifests)")
    from spark_jobs.recover import run_rebuild_manifests, run_recover, summary_lines

    with _context(config_path, master, "tiered-recover") as ctx:
        if topic is not None and log_dir is not None:
            summary = run_recover(
                ctx, topic=topic, log_dir=log_dir, max_bytes=max_bytes, overwrite=overwrite
            )
        else:
            summary = run_rebuild_manifests(ctx, topic=topic)
    emit_summary(summary, as_json=as_json, human=summary_lines)


# -- scrub -------------------------------------------------------------------------------------


@click.command("scrub")
@config_option
@click.option("--topic", default=None, help="Only this topic (default: every topic).")
@click.option("--delete-orphans", is_flag=True,
              help="Delete objects no manifest names (older than the GC grace period).")
@master_option
@json_option
def scrub_command(
    config_path: Path, topic: str | None, delete_orphans: bool, master: str | None, as_json: bool
) -> None:
    """Check every object the manifests name: present, right size and checksum, batch CRCs
    intact; find gaps, overlaps and orphans. Exits 1 on any anomaly."""
    from spark_jobs.scrub import run_scrub, summary_lines

    with _context(config_path, master, "tiered-scrub") as ctx:
        summary = run_scrub(ctx, topic=topic, delete_orphans=delete_orphans)
    emit_summary(summary, as_json=as_json, human=summary_lines)
