"""The daemon: scheduling on an injected clock, health and metrics over real HTTP, error
handling, logging, and SIGTERM on a real `tiered run` subprocess.

Scheduling tests never sleep: the clock is a counter and waiting advances it."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.processes import tiered_command
from support.waiting import wait_until

from archiver.controller import ControllerOutput
from archiver.service import Archiver, ArchiverStats, PartitionReport, PassReport
from tiered.app.daemon import Daemon, DaemonOptions
from tiered.app.health import DaemonState, JobCounters, health_of
from tiered.app.scheduler import (
    UPLOAD_BACKOFF_MAX_S,
    UPLOAD_BACKOFF_MIN_S,
    Scheduler,
    next_upload_delay,
)
from tiered.config import Config, parse_config
from tiered.errors import ConfigError, TieredError
from tiered.store.errors import AccessDenied, BucketNotFound, StoreError

# --- fakes ------------------------------------------------------------------------------------


class FakeTime:
    """A clock that only moves when someone waits; stops once it reaches `until`."""

    def __init__(self, until: float = float("inf")) -> None:
        self.now = 0.0
        self.until = until
        self.waits: list[float] = []
        self._set = False

    def clock(self) -> float:
        return self.now

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None and timeout >= 0
        self.waits.append(timeout)
        self.now += timeout
        if self.now >= self.until:
            self._set = True
        return self._set


class SteppedTime(FakeTime):
    """Each wait blocks until the test calls `step()`: the daemon runs in a thread and the
    test inspects it between steps, deterministically."""

    def __init__(self) -> None:
        super().__init__()
        self._waiting = threading.Semaphore(0)
        self._go = threading.Semaphore(0)

    def wait(self, timeout: float | None = None) -> bool:
        self._waiting.release()
        self._go.acquire()
        return super().wait(timeout)

    def await_idle(self) -> None:
        assert self._waiting.acquire(timeout=30), "daemon never reached its wait"

    def step(self) -> None:
        self._go.release()

    def stop(self) -> None:
        self.set()
        self._go.release()


class FakeStore:
    def __init__(self) -> None:
        self.up = True
        self.closed = False

    def exists(self, key: str) -> bool:
        if not self.up:
            raise StoreError("connection refused (127.0.0.1:1)")
        return False

    def close(self) -> None:
        self.closed = True


class FakeArchiver:
    """Records each call with the fake time; `plan` scripts upload rounds."""

    def __init__(self, time_: FakeTime) -> None:
        self.time = time_
        self.calls: list[tuple[str, float]] = []
        self.uploads: list[PassReport | Exception] = []
        self.partitions = [("orders", 0), ("orders", 1)]
        self.closed = False
        self.fail_housekeeping: Exception | None = None
        #: the flags a daemon sets on `Archiver.housekeeper`
        self.housekeeper = SimpleNamespace(spread_first_full_pass=False, census=False)

    def _call(self, name: str) -> None:
        self.calls.append((name, self.time.now))

    def scan(self) -> None:
        self._call("scan")

    def upload_round(self) -> PassReport:
        self._call("upload_round")
        if self.uploads:
            item = self.uploads.pop(0)
            if isinstance(item, Exception):
                raise item
            return item
        return PassReport([PartitionReport(t, p, 0, 0, "up_to_date", None)
                           for t, p in self.partitions])

    def housekeeping(self) -> PassReport:
        self._call("housekeeping")
        if self.fail_housekeeping is not None:
            raise self.fail_housekeeping
        return PassReport([], deleted_remote_objects=0)

    def local_retention(self) -> PassReport:
        self._call("local_retention")
        return PassReport([])

    def update_controller(self) -> ControllerOutput:
        self._call("update_controller")
        return ControllerOutput(-100.0, 200, 0.1, True)

    def snapshot(self) -> ArchiverStats:
        return ArchiverStats(uploaded_segments_total=len(self.calls), controller_shares=200,
                             pending_bytes_by_partition={("orders", 0): 123})

    def close(self) -> None:
        self.closed = True


def _config(tmp_path: Path, **cluster: Any) -> Config:
    (tmp_path / "log").mkdir(exist_ok=True)
    data = {
        "storage": {"url": (tmp_path / "bucket").as_uri()},
        "log": {"dirs": [str(tmp_path / "log")]},
        "cache": {"dir": str(tmp_path / "cache")},
        "cluster": {
            "cloud_storage_housekeeping_interval_ms": 60_000,
            "cloud_storage_upload_ctrl_update_interval_ms": 20_000,
            "retention_local_trim_interval": 30_000,
            **cluster,
        },
    }
    return parse_config(data, source="test.toml", base_dir=tmp_path)


def _report(uploaded: int, error: str | None = None) -> PassReport:
    return PassReport([
        PartitionReport("orders", 0, uploaded, uploaded * 1000,
                        "uploaded" if uploaded else "up_to_date", None),
        PartitionReport("orders", 1, 0, 0, "corrupt_segment" if error else "up_to_date", error),
    ])


def _daemon(tmp_path: Path, time_: FakeTime, archiver: FakeArchiver,
            store: FakeStore | None = None, **kw: Any) -> Daemon:
    store = store or FakeStore()
    return Daemon(
        _config(tmp_path), DaemonOptions(metrics_port=0),
        open_store=kw.pop("open_store", lambda c: store),
        new_archiver=lambda c, s: cast("Archiver", archiver), clock=time_.clock,
        new_keeper=kw.pop("new_keeper", lambda c, s, on_change: None),
        wall_clock=lambda: 1.7e9,
        stop=time_, **kw,
    )


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as err:
        body, status = err.read().decode(), err.code
    return status, (json.loads(body) if url.endswith("/health") else body)


# --- scheduler ----------------------------------------------------------------------------


def test_scheduler_runs_jobs_in_order_then_each_at_its_interval() -> None:
    t = FakeTime(until=10.0)
    ran: list[tuple[str, float]] = []

    def job(name: str) -> Callable[[], None]:
        return lambda: ran.append((name, t.now))

    s = Scheduler(t.clock)
    s.add("a", 2.0, job("a"))
    s.add("b", 5.0, job("b"))
    s.run(t)
    assert ran[:2] == [("a", 0.0), ("b", 0.0)]
    assert [when for name, when in ran if name == "a"] == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert [when for name, when in ran if name == "b"] == [0.0, 5.0]


def test_scheduler_interval_counts_from_the_end_of_a_slow_run() -> None:
    t = FakeTime(until=20.0)
    starts: list[float] = []

    def slow() -> None:
        starts.append(t.now)
        t.now += 3.0  # the job itself takes 3 s

    s = Scheduler(t.clock)
    s.add("slow", 5.0, slow)
    s.run(t)
    # 0 (ends 3) -> 8 (ends 11) -> 16: no catch-up burst after the slow runs
    assert starts == [0.0, 8.0, 16.0]


def test_scheduler_action_can_ask_for_an_earlier_or_later_next_run() -> None:
    t = FakeTime(until=4.0)
    when: list[float] = []
    delays = iter([0.0, 0.0, 1.5, 0.5])

    def job() -> float | None:
        when.append(t.now)
        return next(delays, None)

    s = Scheduler(t.clock)
    s.add("x", 10.0, job)
    s.run(t)
    assert when == [0.0, 0.0, 0.0, 1.5, 2.0]


def test_scheduler_checks_stop_between_jobs() -> None:
    t = FakeTime()
    ran: list[str] = []

    def first() -> None:
        ran.append("first")
        t.set()

    s = Scheduler(t.clock)
    s.add("first", 1.0, first)
    s.add("second", 1.0, lambda: ran.append("second"))
    s.run(t)
    assert ran == ["first"]
    assert t.waits == []


def test_scheduler_rejects_a_non_positive_interval() -> None:
    with pytest.raises(ValueError, match="interval"):
        Scheduler().add("x", 0, lambda: None)


def test_upload_backoff_doubles_while_idle_and_resets_on_progress() -> None:
    delays = [next_upload_delay(None, False)]
    for _ in range(10):
        delays.append(next_upload_delay(delays[-1], False))
    assert delays[0] == UPLOAD_BACKOFF_MIN_S
    assert delays[1] == 2 * UPLOAD_BACKOFF_MIN_S
    assert delays[-1] == UPLOAD_BACKOFF_MAX_S
    assert delays == sorted(delays)
    assert next_upload_delay(UPLOAD_BACKOFF_MAX_S, True) == 0.0


# --- the daemon's loop --------------------------------------------------------------------


def test_daemon_schedules_upload_controller_retention_and_housekeeping(tmp_path: Path) -> None:
    t = FakeTime(until=125.0)
    archiver = FakeArchiver(t)
    store = FakeStore()
    assert _daemon(tmp_path, t, archiver, store).run() == 0

    names = [name for name, _ in archiver.calls]
    # start-up order: discover and upload first, then the others
    assert names[:5] == ["scan", "upload_round", "update_controller", "local_retention",
                         "housekeeping"]
    # every upload round rescans, so partitions created while running are picked up
    rounds = [i for i, n in enumerate(names) if n == "upload_round"]
    assert all(names[i - 1] == "scan" for i in rounds)

    def times(name: str) -> list[float]:
        return [when for n, when in archiver.calls if n == name]

    assert times("housekeeping") == [0.0, 60.0, 120.0]
    assert times("update_controller") == [0.0, 20.0, 40.0, 60.0, 80.0, 100.0, 120.0]
    assert times("local_retention") == [0.0, 30.0, 60.0, 90.0, 120.0]
    # idle upload rounds back off 0.1, 0.2, 0.4 ... up to 10 s between rounds
    gaps = [b - a for a, b in zip(times("upload_round"), times("upload_round")[1:],
                                  strict=False)]
    assert gaps[0] == pytest.approx(UPLOAD_BACKOFF_MIN_S)
    assert max(gaps) == pytest.approx(UPLOAD_BACKOFF_MAX_S)
    assert archiver.closed and store.closed
    # a daemon's housekeeping: first full passes spread over a grace period, then a census
    # of the bucket instead of a full pass per idle partition (docs/operations.md)
    assert archiver.housekeeper.spread_first_full_pass and archiver.housekeeper.census


def test_upload_rounds_repeat_at_once_while_there_is_progress(tmp_path: Path) -> None:
    t = FakeTime(until=1.0)
    archiver = FakeArchiver(t)
    archiver.uploads = [_report(2), _report(1), _report(0)]
    _daemon(tmp_path, t, archiver).run()
    rounds = [when for n, when in archiver.calls if n == "upload_round"]
    assert rounds[:3] == [0.0, 0.0, 0.0]  # two rounds with progress: no pause
    assert rounds[3] == pytest.approx(UPLOAD_BACKOFF_MIN_S)  # the idle one backs off


def test_a_failing_job_is_counted_and_the_others_go_on(tmp_path: Path) -> None:
    t = FakeTime(until=61.0)
    archiver = FakeArchiver(t)
    archiver.fail_housekeeping = TieredError("listing failed")
    archiver.uploads = [RuntimeError("a bug"), _report(1)]
    daemon = _daemon(tmp_path, t, archiver)
    assert daemon.run() == 0
    jobs = daemon.state.jobs
    assert jobs["housekeeping"].runs == 2 and jobs["housekeeping"].failures == 2
    assert jobs["housekeeping"].last_success_s is None
    assert jobs["upload"].failures == 1 and jobs["upload"].runs > 2
    assert jobs["upload"].last_success_s == 1.7e9
    assert daemon.state.last_errors["housekeeping"] == ("listing failed",)
    assert daemon.state.last_errors["upload"] == ()


def test_refuses_to_start_without_log_dirs(tmp_path: Path) -> None:
    config = parse_config({"storage": {"url": (tmp_path / "b").as_uri()}}, source="x.toml")
    with pytest.raises(ConfigError, match=r"\[log\] dirs is not set"):
        Daemon(config, DaemonOptions(metrics_port=0))


def test_refuses_to_start_with_a_missing_log_dir(tmp_path: Path) -> None:
    config = parse_config({"storage": {"url": (tmp_path / "b").as_uri()},
                           "log": {"dirs": [str(tmp_path / "nope")]}}, source="x.toml")
    with pytest.raises(ConfigError, match=r"nope does not exist or is not a directory"):
        Daemon(config, DaemonOptions(metrics_port=0))


def test_a_busy_metrics_port_is_a_clear_error(tmp_path: Path) -> None:
    t = FakeTime()
    first = _daemon(tmp_path, t, FakeArchiver(t))
    try:
        where = f"127.0.0.1:{first.server.port}"
        with pytest.raises(TieredError, match=f"cannot serve metrics on {where}"):
            Daemon(_config(tmp_path), DaemonOptions(metrics_port=first.server.port))
    finally:
        first.server.stop()


def test_logs_one_line_per_upload_and_a_partition_error_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = FakeTime(until=0.5)
    archiver = FakeArchiver(t)
    crc = "crc mismatch at byte 61"
    archiver.uploads = [_report(2, crc), _report(1, crc)]
    with caplog.at_level(logging.INFO, logger="tiered.app.daemon"):
        _daemon(tmp_path, t, archiver).run()
    messages = [r.getMessage() for r in caplog.records]
    assert "uploaded 2 segment(s) of orders-0 (2.0 KiB)" in messages
    assert "uploaded 1 segment(s) of orders-0 (1000 B)" in messages
    assert sum("crc mismatch at byte 61" in m for m in messages) == 1
    assert "orders-1: upload recovered (up_to_date)" in messages
    assert any(m.startswith("found 2 partition(s)") for m in messages)


def test_a_second_signal_abandons_the_running_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = FakeTime()
    archiver = FakeArchiver(t)
    store = FakeStore()
    daemon = _daemon(tmp_path, t, archiver, store)
    after: list[str] = []

    def interrupted_round() -> PassReport:
        daemon._on_signal(signal.SIGTERM, None)  # first: finish this step, then stop
        after.append("kept going after the first signal")
        daemon._on_signal(signal.SIGTERM, None)  # second: leave now
        after.append("kept going after the second signal")
        return PassReport([])

    archiver.upload_round = interrupted_round  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="tiered.app.daemon"):
        assert daemon.run() == 0
    assert after == ["kept going after the first signal"]
    assert archiver.closed and store.closed
    assert "received SIGTERM again: abandoning the running step" in caplog.text
    assert daemon.state.phase == "stopping"


# --- health and metrics over HTTP ---------------------------------------------------------


@pytest.fixture
def stepped(tmp_path: Path) -> Iterator[tuple[Daemon, SteppedTime, FakeArchiver, FakeStore]]:
    t = SteppedTime()
    archiver = FakeArchiver(t)
    store = FakeStore()
    daemon = _daemon(tmp_path, t, archiver, store)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    try:
        yield daemon, t, archiver, store
    finally:
        t.stop()
        thread.join(timeout=30)
        assert not thread.is_alive()


def test_health_follows_the_rounds(stepped: tuple[Daemon, SteppedTime, FakeArchiver,
                                                  FakeStore]) -> None:
    daemon, t, archiver, store = stepped
    url = daemon.server.url + "/health"
    t.await_idle()  # first batch of jobs done
    status, body = _get(url)
    assert (status, body["status"]) == (200, "ok")
    assert body["store_up"] is True and body["partitions"] == 2
    assert body["jobs"]["upload"]["runs"] == 1

    # a corrupt segment in one partition: degraded, still 200
    archiver.uploads = [_report(1, "crc mismatch")]
    t.step()
    t.await_idle()
    status, body = _get(url)
    assert (status, body["status"]) == (200, "degraded")
    assert body["jobs"]["upload"]["errors"] == ["orders-1: corrupt_segment: crc mismatch"]

    # the store stops answering: 503
    store.up = False
    archiver.uploads = [PassReport([], errors=["PUT failed: connection refused"])]
    t.step()
    t.await_idle()
    status, body = _get(url)
    assert (status, body["status"]) == (503, "unavailable")
    assert "connection refused" in body["reason"]

    # it comes back and a round succeeds: ok again
    store.up = True
    t.step()
    t.await_idle()
    status, body = _get(url)
    assert (status, body["status"]) == (200, "ok")


def test_metrics_endpoint_serves_archiver_and_job_metrics(
    stepped: tuple[Daemon, SteppedTime, FakeArchiver, FakeStore]
) -> None:
    daemon, t, archiver, store = stepped
    t.await_idle()
    _, text = _get(daemon.server.url + "/metrics")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("tiered_upload_controller_shares", ())] == 200
    assert samples[("tiered_pending_upload_bytes",
                    (("partition", "0"), ("topic", "orders")))] == 123
    assert samples[("tiered_daemon_job_runs_total", (("job", "housekeeping"),))] == 1
    assert samples[("tiered_store_up", ())] == 1


def _start_against_a_failing_store(
    tmp_path: Path, failures: int, error: StoreError
) -> tuple[Daemon, threading.Thread, SteppedTime, FakeArchiver, list[float]]:
    """A daemon whose store raises `error` on its first `failures` openings, then works;
    started on its own thread (stop it with `t.stop()` and a join)."""
    t = SteppedTime()
    archiver = FakeArchiver(t)
    attempts: list[float] = []
    store = FakeStore()

    def open_store(config: Config) -> FakeStore:
        attempts.append(t.now)
        if len(attempts) <= failures:
            raise error
        return store

    daemon = _daemon(tmp_path, t, archiver, open_store=open_store)
    return daemon, threading.Thread(target=daemon.run), t, archiver, attempts


def test_waits_for_an_unreachable_store_at_start_with_health_503(tmp_path: Path) -> None:
    daemon, thread, t, archiver, attempts = _start_against_a_failing_store(
        tmp_path, 2, StoreError("could not connect to http://127.0.0.1:1"))
    thread.start()
    try:
        t.await_idle()
        status, body = _get(daemon.server.url + "/health")
        assert (status, body["status"]) == (503, "unavailable")
        t.step()
        t.await_idle()
        t.step()
        t.await_idle()  # third attempt worked, the first rounds ran
        assert _get(daemon.server.url + "/health")[1]["status"] == "ok"
        assert attempts == [0.0, 1.0, 3.0]  # backoff 1 s, then 2 s
        assert [n for n, _ in archiver.calls][:2] == ["scan", "upload_round"]
    finally:
        t.stop()
        thread.join(timeout=30)


def test_a_missing_bucket_is_said_once_and_waited_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    daemon, thread, t, _, _ = _start_against_a_failing_store(
        tmp_path, 3, BucketNotFound("put s3://b/k: the bucket does not exist (NoSuchBucket)"))
    with caplog.at_level(logging.DEBUG, logger="tiered.app.daemon"):
        thread.start()
        try:
            t.await_idle()
            status, body = _get(daemon.server.url + "/health")
            assert status == 503 and "bucket does not exist" in json.dumps(body)
            for _ in range(3):
                t.step()
                t.await_idle()
            assert _get(daemon.server.url + "/health")[1]["status"] == "ok"
        finally:
            t.stop()
            thread.join(timeout=30)
    said = [r for r in caplog.records if "does not exist" in r.getMessage()]
    assert len(said) == 3 and [r.levelno for r in said].count(logging.ERROR) == 1
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]


def test_access_denied_at_start_is_an_error_not_a_wait(tmp_path: Path) -> None:
    t = FakeTime()

    def open_store(config: Config) -> FakeStore:
        raise AccessDenied("403 on s3://b")

    daemon = _daemon(tmp_path, t, FakeArchiver(t), open_store=open_store)
    with pytest.raises(AccessDenied):
        daemon.run()


def test_health_of_a_history_server_is_ok_without_upload_rounds() -> None:
    health = health_of(DaemonState(archiving=False, store_up=None), now_s=1.0)
    assert (health.status, health.body["status"]) == (200, "ok")


def test_health_of_before_the_first_round_is_starting() -> None:
    health = health_of(DaemonState(started_s=5.0), now_s=7.5)
    assert health.status == 200 and health.body["status"] == "starting"
    assert health.body["uptime_s"] == 2.5
    ok = health_of(DaemonState(jobs={"upload": JobCounters(1, 0, 1.0)}, store_up=True), 0.0)
    assert ok.body["status"] == "ok"


# --- a real process -----------------------------------------------------------------------



@pytest.mark.slow  # daemon processes
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_stops_a_running_daemon_cleanly(tmp_path: Path, signum: int) -> None:
    from tiered.kafka.checkpoints import TopicPartition
    from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks

    log_dir = tmp_path / "log"
    with LogWriter(log_dir / "orders-0", segment_bytes=2048, fsync=False) as w:
        for i in range(60):
            w.append([ProducerRecord(b"v" * 100, key=str(i).encode())])
        end = w.log_end_offset
    write_high_watermarks(log_dir, {TopicPartition("orders", 0): end}, fsync=False)
    config = tmp_path / "tiered.toml"
    config.write_text(f'[storage]\nurl = "{(tmp_path / "bucket").as_uri()}"\n'
                      f'[log]\ndirs = ["{log_dir}"]\n')
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as err:
        argv = tiered_command("run", "--config", str(config), "--metrics-port", "0")
        proc = subprocess.Popen(argv,
                                stdout=subprocess.DEVNULL, stderr=err,
                                env={**os.environ, "PYTHONUNBUFFERED": "1",
                                     # no [cache] dir: the default one, kept in the test's dir
                                     "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    try:
        wait_until(lambda: "upload round" in stderr.read_text(), "the first upload round")
        if signum == signal.SIGTERM:  # the real archiver's numbers, over real HTTP
            url = re.search(r"metrics and health on (http://\S+) ", stderr.read_text())
            assert url is not None
            wait_until(lambda: _get(url.group(1) + "/health")[1]["partitions"] == 1,
                      "the first round to be published")
            status, body = _get(url.group(1) + "/health")
            assert (status, body["status"], body["store_up"]) == (200, "ok", True)
            _, text = _get(url.group(1) + "/metrics")
            samples = {s.name: s.value for f in text_string_to_metric_families(text)
                       for s in f.samples if not s.labels}
            assert samples["tiered_uploaded_segments_total"] >= 1
            assert samples["tiered_manifest_commits_total"] >= 1
            # and records, on the same port
            status, text = _get(url.group(1) + "/v1/topics/orders/partitions/0/records"
                                "?offset=0&max_bytes=1&format=jsonl")
            first = json.loads(text.splitlines()[0])
            assert (status, first["offset"], first["key"]) == (200, 0, "MA==")  # b"0"
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = stderr.read_text()
    assert f"received {signal.Signals(signum).name}: stopping after the current step" in text
    assert "tiered run: stopped" in text
    assert "Traceback" not in text


def test_report_problems_lists_each_problem_once() -> None:
    from tiered.app.daemon import report_problems

    report = PassReport(
        [PartitionReport("orders", 0, 0, 0, "corrupt_segment", "crc mismatch"),
         PartitionReport("orders", 1, 0, 0, "error", "manifest unreadable"),
         PartitionReport("orders", 2, 1, 10, "uploaded", None)],
        errors=["orders-0: crc mismatch", "saving the topic manifest: 503"],
    )
    assert report_problems(report) == [
        "orders-0: crc mismatch",
        "saving the topic manifest: 503",
        "orders-1: error: manifest unreadable",
    ]
    assert report_problems(PassReport([PartitionReport("a", 0)])) == []


def test_health_is_degraded_while_the_cache_cannot_write() -> None:
    state = DaemonState(jobs={"upload": JobCounters(1, 0, 1.0)}, store_up=True)
    assert health_of(state, 0.0).body["status"] == "ok"
    broken = health_of(state, 0.0, cache_problem="cannot write /cache/x: Read-only file system")
    assert broken.status == 200 and broken.body["status"] == "degraded"
    assert "Read-only" in str(broken.body["cache_error"])
