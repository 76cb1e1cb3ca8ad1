"""What every Spark job shares: the job context, partition enumeration, executor-side stores,
progress on stderr and the summary printout.

The driver holds the configuration, one `ObjectStore` and a `ManifestStore`: it reads and
commits manifests. Executors receive only picklable values (`StoreSettings`, `PartitionRef`,
plain task tuples) and build their own store once per Spark partition (`map_with_store`).
Nothing here imports pyspark at module import time: the daemon installs without Spark.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import click

from manifests import ManifestSettings, ManifestStore, TopicManifest
from manifests.errors import ManifestError
from manifests.topic import iter_topic_manifest_keys, load_topic_manifest
from tiered.config import Config, load_config
from tiered.config.units import format_size
from tiered.errors import TieredError
from tiered.store import open_store
from tiered.store.base import ObjectStore, StoreSettings

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

log = logging.getLogger("tiered.spark")

T = TypeVar("T")
R = TypeVar("R")

#: seconds between progress lines when stderr is not a terminal (a log file)
LOG_PROGRESS_INTERVAL_S = 10.0
#: seconds between progress redraws on a terminal
TTY_PROGRESS_INTERVAL_S = 1.0


class PartitionRef(NamedTuple):
    """One partition in the bucket, as a topic manifest names it (picklable, hashable)."""

    topic: str
    partition: int
    revision: str

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition} (revision {self.revision})"


@dataclass(frozen=True)
class Enumeration:
    """Partitions found through the topic manifests, and the topic manifests that could not
    be read (each problem names the object key), so a job reports them instead of stopping."""

    topics: tuple[TopicManifest, ...]
    partitions: tuple[PartitionRef, ...]
    problems: tuple[str, ...] = ()

    def require(self, topic: str | None) -> Enumeration:
        """Self, or an error when a job was asked for one topic the bucket does not know (not
        even as an unreadable manifest): a typo must not pass for "nothing to do"."""
        if topic is not None and not self.topics and not self.problems:
            raise UnknownTopic(f"unknown topic {topic!r}: the bucket holds no topic manifest "
                               "for it (check the name, or the [storage] url; if manifests "
                               "were lost, `tiered recover --rebuild-manifests` recreates them)")
        return self


class UnknownTopic(TieredError):
    """A job named a topic that is not in the bucket."""

    exit_code = 7


def enumerate_partitions(store: ObjectStore, topic: str | None = None) -> Enumeration:
    """Every partition of every topic manifest in the bucket (16 listings), optionally only
    those of `topic` (every revision of it: a recreated topic's old data is still there)."""
    topics: list[TopicManifest] = []
    problems: list[str] = []
    for name, revision, key in iter_topic_manifest_keys(store):
        if topic is not None and name != topic:
            continue
        try:
            t = load_topic_manifest(store, name, revision)
        except ManifestError as exc:
            problems.append(f"{key}: unreadable topic manifest: {exc}")
            continue
        if t is None:  # deleted between the listing and the read
            continue
        topics.append(t)
    topics.sort(key=lambda t: (t.topic, t.revision))
    parts = tuple(
        PartitionRef(t.topic, p, t.revision) for t in topics for p in range(t.partition_count)
    )
    return Enumeration(tuple(topics), parts, tuple(problems))


@dataclass
class JobContext:
    """A job's driver-side state: configuration, the bucket, manifests and (lazily) Spark.

    `settings` is what executors get; `store` and `manifests` stay on the driver. The Spark
    session starts on first use of `spark`, so planning-only work and `--help` never pay for
    a JVM."""

    config: Config
    settings: StoreSettings
    store: ObjectStore
    manifests: ManifestStore
    #: Spark master URL; None keeps what spark-submit configured, else `local[*]`
    master: str | None = None
    app_name: str = "tiered"
    _session: SparkSession | None = field(default=None, repr=False)

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        master: str | None = None,
        app_name: str = "tiered",
        store: ObjectStore | None = None,
    ) -> JobContext:
        """Open the bucket (probing conditional writes once, here on the driver)."""
        settings = config.store_settings()
        opened = store if store is not None else open_store(settings)
        mstore = ManifestStore(opened, ManifestSettings.from_cluster(config.cluster))
        return cls(config, settings, opened, mstore, master=master, app_name=app_name)

    @classmethod
    def from_config_path(
        cls, path: str | Path, *, master: str | None = None, app_name: str = "tiered"
    ) -> JobContext:
        return cls.from_config(load_config(path), master=master, app_name=app_name)

    @property
    def spark(self) -> SparkSession:
        """The Spark session (started, or joined if one is active, on first use)."""
        if self._session is None:
            from spark_jobs.session import get_session

            self._session = get_session(self.master, app_name=self.app_name)
        return self._session

    @property
    def sc(self) -> SparkContext:
        return self.spark.sparkContext

    def enumerate(self, topic: str | None = None) -> Enumeration:
        return enumerate_partitions(self.store, topic)

    def close(self) -> None:
        """Release the driver's store (the Spark session is shared per process and stays)."""
        self.store.close()

    def __enter__(self) -> JobContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- executors ---------------------------------------------------------------------------------


def map_with_store(
    settings: StoreSettings, fn: Callable[[ObjectStore, T], R]
) -> Callable[[Iterable[T]], Iterator[R]]:
    """A `mapPartitions` function applying `fn(store, item)` to each item, with one store
    built from `settings` per Spark partition (clients do not pickle; one per item would
    cost a TLS handshake each). The driver already probed conditional writes."""

    def run(items: Iterable[T]) -> Iterator[R]:
        store = open_store(settings, probe=False)
        try:
            for item in items:
                yield fn(store, item)
        finally:
            store.close()

    return run


def slices_for(count: int, parallelism: int, *, per_core: int = 2) -> int:
    """How many Spark partitions to cut `count` tasks into: a couple per core so one slow
    task does not hold up the stage (each Spark task costs tens of ms to launch, so not
    more), never more than there are tasks."""
    return max(1, min(count, max(1, parallelism) * per_core))


def balanced_slices(items: Sequence[T], slices: int, weight: Callable[[T], int]
                    ) -> list[list[T]]:
    """`items` cut into `slices` lists of about equal total `weight` (the heaviest first, each
    to the lightest list so far), each list in the items' own order: one Spark partition each
    (`sc.parallelize(lists, len(lists)).flatMap(...)`), where `parallelize` would cut by count
    and put a run of large items in one partition."""
    n = max(1, min(slices, len(items)))
    loads = [(0, i) for i in range(n)]
    members: list[list[int]] = [[] for _ in range(n)]
    for at in sorted(range(len(items)), key=lambda k: -weight(items[k])):
        load, i = heapq.heappop(loads)
        members[i].append(at)
        heapq.heappush(loads, (load + weight(items[at]), i))
    return [[items[k] for k in sorted(m)] for m in members if m]


# -- progress ----------------------------------------------------------------------------------


class Progress:
    """Reports a running job on stderr from a daemon thread the reporter owns: completed
    tasks of the job group (from Spark's status tracker) and a byte count (from an
    accumulator the tasks add to; the driver sees it as tasks finish).

    Use as a context manager around the Spark action; `done()` prints the final line. Output
    goes to stderr only, so `--json` on stdout stays machine-readable."""

    def __init__(
        self,
        sc: SparkContext,
        label: str,
        *,
        group: str,
        total_tasks: int,
        bytes_done: Callable[[], int] | None = None,
        interval_s: float | None = None,
        stream: Any = None,
    ) -> None:
        self.sc = sc
        self.label = label
        self.group = group
        self.total_tasks = total_tasks
        self.bytes_done = bytes_done
        self.stream = stream if stream is not None else sys.stderr
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._tty = tty
        if interval_s is None:
            interval_s = TTY_PROGRESS_INTERVAL_S if tty else LOG_PROGRESS_INTERVAL_S
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        self._bar: Any = None  # click's progress bar, on a terminal

    def completed_tasks(self) -> int:
        """Tasks finished so far in this job group (0 before Spark reports any)."""
        tracker = self.sc.statusTracker()
        done = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            if job is None:
                continue
            for stage_id in job.stageIds:
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
        return done

    def line(self) -> str:
        elapsed = time.monotonic() - self._started
        done = self.completed_tasks()
        # total_tasks 0: a job of several stages whose task count is not known up front
        tasks = f"{done}/{self.total_tasks}" if self.total_tasks else f"{done}"
        parts = [f"{self.label}: {tasks} tasks"]
        if self.bytes_done is not None:
            moved = self.bytes_done()
            rate = moved / elapsed if elapsed > 0 else 0.0
            parts.append(f"{format_size(moved)} ({format_size(int(rate))}/s)")
        parts.append(f"{elapsed:.0f} s")
        return ", ".join(parts)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._show(final=False)
            except Exception:  # the tracker may be gone while the context stops
                return

    def _show(self, *, final: bool) -> None:
        """On a terminal, click's progress bar (tasks done of all, bytes moved beside it);
        elsewhere (a log file, a CI run) one plain line per interval."""
        if self._bar is not None:
            done = self.completed_tasks()
            self._bar.update(max(0, done - self._bar.pos))
            if final:
                self._bar.render_finish()
            return
        self.stream.write(self.line() + "\n")
        self.stream.flush()

    def _bytes_text(self, _item: object = None) -> str:
        if self.bytes_done is None:
            return ""
        elapsed = time.monotonic() - self._started
        moved = self.bytes_done()
        rate = moved / elapsed if elapsed > 0 else 0.0
        return f"{format_size(moved)} ({format_size(int(rate))}/s)"

    def __enter__(self) -> Progress:
        self.sc.setJobGroup(self.group, self.label)
        self._started = time.monotonic()
        if self._tty and self.total_tasks:
            self._bar = click.progressbar(length=max(1, self.total_tasks), label=self.label,
                                          file=self.stream, show_eta=False,
                                          item_show_func=self._bytes_text)
            self._bar.__enter__()
        self._thread = threading.Thread(target=self._loop, name=f"progress-{self.group}",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        # a failed last progress line must not mask the job's own outcome
        with contextlib.suppress(Exception):
            self._show(final=True)
        if self._bar is not None:
            with contextlib.suppress(Exception):
                self._bar.__exit__(None, None, None)


# -- output ------------------------------------------------------------------------------------


def emit_summary(
    summary: dict[str, Any], *, as_json: bool, human: Callable[[dict[str, Any]], Iterable[str]]
) -> None:
    """Print a job's summary (JSON on stdout with `--json`, else `human(summary)` lines) and
    exit 1 when `summary["ok"]` is false, so scripts see failures."""
    if as_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=False, default=str))
    else:
        for line in human(summary):
            click.echo(line)
    if not summary.get("ok", False):
        sys.exit(1)


def job_error(exc: BaseException) -> str:
    """One line for a per-partition failure in a summary: domain errors (store errors
    included) by their message; anything else with its type, since that is a bug to report."""
    if isinstance(exc, TieredError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
