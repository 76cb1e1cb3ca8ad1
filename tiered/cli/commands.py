"""The archiver's commands on the `tiered` group: `run`, `archive --once`, `describe-storage`
and `demo`. Importing this module registers them (tiered.cli.main imports it once).

Each command builds what it needs from the configuration and hands the work to the module
that owns it (`tiered.app.daemon`, `archiver.service`, `tiered.app.demo`); here are only options,
output and exit codes: 0 on success, 1 when a pass reported a problem, and the error's own
code for a `TieredError` (2 for configuration, 5 for the object store, ...).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from tiered.app.daemon import (
    DEFAULT_METRICS_HOST,
    DEFAULT_METRICS_PORT,
    check_log_dirs,
    report_problems,
)
from tiered.cli.options import config_option, json_option
from tiered.errors import TieredError

if TYPE_CHECKING:
    from archiver.service import Archiver, PassReport
    from tiered.config import Config

__all__ = ["archive_command", "demo_command", "describe_storage_command", "run_command",
           "report_json"]


#: attempts per store request for describe-storage: it reads, and a person waits for it
DESCRIBE_ATTEMPTS = 2


def _load(config_path: Path, command: str) -> Config:
    """The configuration, refusing one without usable log dirs: every command here reads
    them."""
    from tiered.config import load_config

    config = load_config(config_path)
    check_log_dirs(config, command)
    return config


@contextmanager
def _archiver(
    config: Config, *, probe: bool | Literal["beside"], full_speed: bool = False,
    max_attempts: int | None = None,
) -> Iterator[Archiver]:
    """An Archiver on the configured store, closed (with the store) afterwards. `probe`:
    prove conditional writes, needed by every command that commits manifests; "beside" runs
    the proof beside the work (see `ProbingStore`) and its failure still ends the command
    with the probe's own error and exit code, as a probe in front would.
    `full_speed`: pin the upload budget at the controller's maximum shares. The PD controller
    paces a running daemon by its backlog; a one-shot pass the operator asked for should not
    crawl at minimum shares just because the disk is roomy."""
    from archiver.service import Archiver
    from tiered.store import ProbingStore, open_store

    settings = config.store_settings()
    if max_attempts is not None:
        settings = dataclasses.replace(settings, max_attempts=max_attempts)
    store = open_store(settings, probe=probe)
    try:
        from archiver.controller import ControllerParams

        params = ControllerParams.from_cluster(config.cluster)
        shares = params.max_shares if full_speed else None
        archiver = Archiver(config, store, fixed_shares=shares)
        try:
            yield archiver
        finally:
            archiver.close()
            if isinstance(store, ProbingStore):
                store.verdict()  # a failed probe is the command's error, whatever else failed
    finally:
        store.close()


# --- run ---------------------------------------------------------------------------------------


@click.command("run")
@config_option
@click.option("--metrics-host", default=DEFAULT_METRICS_HOST, show_default=True,
              help="Address /metrics and /health listen on (0.0.0.0: every interface).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=DEFAULT_METRICS_PORT,
              show_default=True, help="Port of /metrics and /health (0: any free port).")
def run_command(config_path: Path, metrics_host: str, metrics_port: int) -> None:
    """Run the archiver daemon until SIGTERM or Ctrl-C.

    Uploads every closed segment of every partition in the log dirs (new partitions are
    picked up while running), commits manifests, applies remote and local retention and
    garbage collection on their schedules, and serves Prometheus metrics on /metrics, a
    health check on /health and record reads on
    /v1/topics/TOPIC/partitions/P/records?offset=N; with a [kafka] section, a read-only
    Kafka endpoint too. With [log] dirs = [] it archives nothing and serves the bucket alone
    (a history server). The first SIGTERM finishes the current step and exits 0.

    Without an [http] section the HTTP port has no authentication and serves record data:
    keep --metrics-host on loopback (the default), or set [http] auth = "basic" with TLS
    (docs/security.md).
    """
    from tiered.app.daemon import Daemon, DaemonOptions

    config = _load(config_path, "run")
    daemon = Daemon(config, DaemonOptions(metrics_host=metrics_host, metrics_port=metrics_port))
    sys.exit(daemon.run())


# --- archive --once ----------------------------------------------------------------------------


def report_json(report: PassReport) -> dict[str, Any]:
    """A pass report as `archive --once --json` prints it."""
    return {
        "ok": report.ok,
        "uploaded_segments": sum(p.uploaded_segments for p in report.partitions),
        "uploaded_bytes": sum(p.uploaded_bytes for p in report.partitions),
        "deleted_remote_objects": report.deleted_remote_objects,
        "deleted_local_segments": report.deleted_local_segments,
        "errors": list(report.errors),
        "partitions": [asdict(p) for p in report.partitions],
    }


def _report_lines(report: PassReport, url: str) -> list[str]:
    from tiered.config.units import format_size

    uploaded = [p for p in report.partitions if p.uploaded_segments]
    segments = sum(p.uploaded_segments for p in uploaded)
    size = sum(p.uploaded_bytes for p in uploaded)
    lines = [
        f"{len(report.partitions)} partition(s): uploaded {segments} segment(s) "
        f"({format_size(size)}) from {len(uploaded)} of them to {url}",
        f"retention: deleted {report.deleted_remote_objects} object(s) from the bucket and "
        f"{report.deleted_local_segments} local segment(s)",
    ]
    return lines


#: allocations between young-generation collections during `archive --once` (default 700)
ONE_PASS_GC_THRESHOLD = 100_000


@contextmanager
def _gc_for_one_pass() -> Iterator[None]:
    """Tune the cyclic GC for a bounded, allocation-heavy pass: the objects the imports and
    the S3 client built stay for the whole process (freeze them out of collections), and
    botocore allocates dicts per request on 20 threads, so the default threshold (700) runs a
    collection, holding the GIL, every few requests. In a side-by-side harness on the
    upload benchmark's data (same moto, alternating runs) the pass took a median 0.9 s less
    of ~8 s; within `benchmarks/upload.py`'s own noise it does not show reliably. Cycles are
    still collected, just in larger batches; the settings are restored afterwards (the
    command may run inside a longer process)."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(ONE_PASS_GC_THRESHOLD, 50, 50)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


@click.command("archive")
@config_option
@click.option("--once", is_flag=True,
              help="Run one full pass and exit (required; `tiered run` is the daemon).")
@json_option
def archive_command(config_path: Path, once: bool, as_json: bool) -> None:
    """One full archiving pass: upload every eligible segment, commit manifests, apply
    remote and local retention, collect garbage.

    Exits 0 only when everything succeeded; 1 when any partition or step reported a
    problem (a corrupt segment, a failed upload, ...) while the others went on; 5 when the
    object store cannot be reached at all, 2 for a bad configuration.
    """
    if not once:
        raise click.UsageError("archive runs one pass: add --once (the daemon is `tiered run`)")
    from tiered.app.cluster import keeper_for, leases_for

    config = _load(config_path, "archive")
    with _archiver(config, probe="beside", full_speed=True) as archiver, _gc_for_one_pass():
        # passive: beside this node's daemon it works under the daemon's leases; alone it
        # takes only what no running sidecar could, and keeps it for its node's next run
        keeper = keeper_for(config, archiver.store, passive=True)
        with leases_for(archiver, keeper, release=False):
            report = archiver.run_once()
    if as_json:
        click.echo(json.dumps(report_json(report), indent=2))
    else:
        for line in _report_lines(report, config.storage.url):
            click.echo(line)
    for error in report_problems(report):
        click.echo(f"error: {error}", err=True)
    sys.exit(0 if report.ok else 1)


# --- describe-storage --------------------------------------------------------------------------


class UnknownTopic(TieredError):
    """describe-storage was asked for a topic nobody holds."""

    exit_code = 7


def _check_topic(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from tiered.config import check_topic_name

    if value is not None and (problem := check_topic_name(value)) is not None:
        raise click.BadParameter(problem)
    return value


def conditions_line(verdict: dict[str, Any] | None) -> str:
    """What the last start-up probe found about the store's conditional writes."""
    if verdict is None:
        return "conditional writes: not probed yet (the first writer probes the store)"
    form = verdict.get("if_match")
    if verdict.get("enforced"):
        return f"conditional writes: enforced (If-Match sent {form})"
    return ("conditional writes: NOT enforced; single-writer opt-out in force "
            "(cloud_storage_allow_unconditional_writes)")


@click.command("describe-storage")
@config_option
@click.option("--topic", default=None, callback=_check_topic, help="Only this topic.")
@json_option
def describe_storage_command(config_path: Path, topic: str | None, as_json: bool) -> None:
    """Per partition: what is on local disk, what is in the bucket, what waits for upload,
    and the offset below which local deletion is safe. Reads only; changes nothing."""
    from archiver.bucket_rows import bucket_rows, bucket_topics
    from tiered.app.cluster import lease_view_for
    from tiered.app.describe import render_rows, summary_line
    from tiered.config import load_config
    from tiered.store import check_reachable
    from tiered.store.probe import recorded_verdict

    config = load_config(config_path)
    if not config.history_server:  # a history server has no log: it describes the bucket
        check_log_dirs(config, "describe-storage")
    # an interactive read: a store that does not answer is said once, after a short retry,
    # rather than once per partition after a long one
    with _archiver(config, probe=False, max_attempts=DESCRIBE_ATTEMPTS) as archiver:
        check_reachable(archiver.store)
        archiver.ownership = lease_view_for(config, archiver.store)
        archiver.scan()
        rows = [] if config.history_server else archiver.describe(topic)
        if config.history_server or (topic is not None and not rows):
            # partitions only the bucket knows: all of them on a history server, or the one
            # topic asked for when this node holds none of it
            known = bucket_topics(archiver.store, topic)
            rows = bucket_rows(archiver.mstore, archiver.ownership, known)
            if topic is not None and not known:
                raise UnknownTopic(f"unknown topic {topic!r}: neither the log dirs nor the "
                                   "bucket hold it (check the name, or the [storage] url)")
        verdict = recorded_verdict(archiver.store)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        for line in render_rows(rows):
            click.echo(line)
        click.echo(conditions_line(verdict))
        if rows:
            click.echo(summary_line(rows))
    if any((row.get("remote") or {}).get("error") for row in rows):
        sys.exit(1)  # some partition's remote state could not be read: the table is partial


# --- demo --------------------------------------------------------------------------------------


@click.command("demo")
@click.option("--dir", "base_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("tiered-demo"), show_default=True,
              help="Where the demo keeps its log, bucket and config.")
def demo_command(base_dir: Path) -> None:
    """Write a sample topic, archive it to a local-directory bucket, trim local retention,
    and show what is local and what is remote. No server needed; runs again to add more."""
    from tiered.app.demo import run_demo

    if click.get_current_context().find_root().params.get("verbose", 0) == 0:
        # the summary is the demo's output: the passes' INFO lines would bury it (-v shows them)
        logging.getLogger().setLevel(logging.WARNING)

    result = run_demo(base_dir, echo=click.echo)
    sys.exit(0 if result.ok else 1)
