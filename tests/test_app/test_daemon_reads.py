"""The daemon's remote-read API over real HTTP (127.0.0.1, ephemeral port): a partition whose
old segments were archived and deleted locally reads back from the bucket byte for byte, the
errors map to their statuses, the reader's and the cache's counters are metrics, reads go on
while the store is unreachable for other partitions, and the reader closes after the server.

The data is the demo's sample topic (3 partitions of ~1.9 MiB in 256 KiB segments), archived
once per module and trimmed to a 512 KiB local target; every test works on its own copy."""

from __future__ import annotations

import base64
import builtins
import contextlib
import dataclasses
import json
import random
import shutil
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.daemons import running

from archiver.service import Archiver
from cache.reader import Reader
from tiered.app.daemon import Daemon, DaemonOptions, open_reader
from tiered.app.demo import DEMO_PARTITIONS, DEMO_TOPIC, demo_config, write_sample_topic
from tiered.config import Config
from tiered.errors import TieredError
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.local_log import LocalLog
from tiered.kafka.records import BatchHeader, iter_batch_headers, iter_batches
from tiered.store import open_store
from tiered.store.base import Blob, ObjectInfo, ObjectStore
from tiered.store.errors import StoreError

# --- the archived sample topic ----------------------------------------------------------------


@dataclass(frozen=True)
class Partition:
    """What was written to one partition, kept before archiving deleted any of it."""

    data: bytes  # every segment file, in offset order: the whole log
    batches: tuple[BatchHeader, ...]  # positions in `data`
    first_segment: bytes
    local_start: int  # the local log start after archiving and local retention
    end: int  # log end = high watermark

    def expected(self, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Kafka's answer: whole batches from the one holding `offset`, the first whatever
        its size, then while the total fits `max_bytes`; and the next offset."""
        taken: list[BatchHeader] = []
        for h in self.batches:
            if h.last_offset < offset:
                continue
            size = sum(t.size for t in taken)
            if taken and size + h.size > max_bytes:
                break
            taken.append(h)
        assert taken, f"offset {offset} is past the log"
        return self.data[taken[0].position:taken[-1].end_position], taken[-1].last_offset + 1


@dataclass(frozen=True)
class Template:
    base: Path
    partitions: dict[int, Partition]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    base = tmp_path_factory.mktemp("reads") / "d"
    config = demo_config(base)
    log_dir = config.log_dirs[0]
    log_dir.mkdir(parents=True)
    write_sample_topic(config, log_dir)
    written: dict[int, tuple[bytes, bytes]] = {}
    for p in range(DEMO_PARTITIONS):
        files = sorted((log_dir / f"{DEMO_TOPIC}-{p}").glob("*.log"))
        written[p] = (b"".join(f.read_bytes() for f in files), files[0].read_bytes())
    with open_store(config.store_settings()) as store:
        archiver = Archiver(config, store)
        try:
            report = archiver.run_once()
        finally:
            archiver.close()
    assert report.ok and report.deleted_local_segments > 0
    partitions = {}
    for part in LocalLog(config.log_dirs):
        data, first = written[part.partition]
        batches = tuple(iter_batch_headers(data))
        assert part.log_start_offset is not None and part.log_start_offset > 0
        partitions[part.partition] = Partition(data, batches, first, part.log_start_offset,
                                               batches[-1].last_offset + 1)
    return Template(base, partitions)


@pytest.fixture
def config(template: Template, tmp_path: Path) -> Config:
    """A private copy of the archived topic (log dir, bucket; an empty cache)."""
    shutil.copytree(template.base, tmp_path / "d")
    return demo_config(tmp_path / "d")


# --- running the daemon -----------------------------------------------------------------------


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def records(daemon: Daemon, partition: int, **params: object) -> tuple[int, dict[str, str],
                                                                         bytes]:
    query = urllib.parse.urlencode(params)
    return get(f"{daemon.server.url}/v1/topics/{DEMO_TOPIC}/partitions/{partition}/records"
               f"?{query}")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


# --- the records endpoint ---------------------------------------------------------------------


def test_offsets_deleted_locally_read_back_from_the_bucket_byte_for_byte(
    config: Config, template: Template
) -> None:
    p0 = template.partitions[0]
    with running(config) as daemon:
        status, headers, body = records(daemon, 0, offset=0, max_bytes=len(p0.first_segment))
    assert status == 200
    # offset 0 is gone from the disk; the answer is the first segment as written
    assert body == p0.first_segment
    assert headers["X-Source"] == "remote"
    assert headers["Content-Type"] == "application/octet-stream"
    first_batches = list(iter_batch_headers(p0.first_segment))
    assert int(headers["X-Next-Offset"]) == first_batches[-1].last_offset + 1
    assert int(headers["X-Log-Start-Offset"]) == 0
    assert int(headers["X-High-Watermark"]) == p0.end


def test_an_offset_inside_a_batch_and_a_read_across_into_the_local_log(
    config: Config, template: Template
) -> None:
    p1 = template.partitions[1]
    inside = p1.batches[3].base_offset + 7  # mid-batch: the whole batch comes first
    crossing = p1.local_start - 1  # the last offset only the bucket has
    with running(config) as daemon:
        status, headers, body = records(daemon, 1, offset=inside, max_bytes=10_000)
        assert status == 200
        assert (body, int(headers["X-Next-Offset"])) == p1.expected(inside, 10_000)
        assert body.startswith(p1.data[p1.batches[3].position:p1.batches[3].end_position])

        status, headers, body = records(daemon, 1, offset=crossing, max_bytes=200_000)
        assert status == 200
        assert headers["X-Source"] == "remote+local"
        assert (body, int(headers["X-Next-Offset"])) == p1.expected(crossing, 200_000)
        assert int(headers["X-Next-Offset"]) > p1.local_start


def test_jsonl_prints_one_record_a_line_from_the_offset(
    config: Config, template: Template
) -> None:
    p2 = template.partitions[2]
    with running(config) as daemon:
        status, headers, body = records(daemon, 2, offset=5, max_bytes=1, format="jsonl")
    assert status == 200
    assert headers["Content-Type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in body.decode().splitlines()]
    first = next(iter_batches(p2.data))  # max_bytes=1: just the batch holding offset 5
    wanted = [r for r in first.records if r.offset >= 5]
    assert [line["offset"] for line in lines] == [r.offset for r in wanted]
    for line, record in zip(lines, wanted, strict=True):
        assert line["timestamp"] == record.timestamp
        assert base64.b64decode(line["key"]) == record.key
        assert base64.b64decode(line["value"]) == record.value
        assert line["headers"] == []
    assert json.loads(base64.b64decode(lines[0]["value"]))["order_id"] == "2-5"


def test_errors_out_of_range_unknown_partition_and_bad_requests(
    config: Config, template: Template
) -> None:
    end = template.partitions[0].end
    with running(config) as daemon:
        status, headers, body = records(daemon, 0, offset=end)
        assert status == 416
        assert headers["Content-Type"] == "application/json"
        error = json.loads(body)
        assert error["error"] == "OFFSET_OUT_OF_RANGE"
        assert (error["log_start_offset"], error["log_end_offset"]) == (0, end)

        status, _, body = records(daemon, DEMO_PARTITIONS, offset=0)
        assert (status, json.loads(body)["error"]) == (404, "UNKNOWN_TOPIC_OR_PARTITION")
        status, _, body = records(daemon, 0, offset="abc")
        assert (status, json.loads(body)["error"]) == (400, "INVALID_REQUEST")
        status, _, body = records(daemon, 0)
        assert status == 400 and "offset" in json.loads(body)["message"]

        request = urllib.request.Request(
            f"{daemon.server.url}/v1/topics/{DEMO_TOPIC}/partitions/0/records?offset=0",
            method="DELETE")
        status, headers, _ = get_request(request)
        assert (status, headers["Allow"]) == (405, "GET, HEAD")
        # /metrics and /health are still there beside the records
        assert get(daemon.server.url + "/health")[0] == 200


def get_request(request: urllib.request.Request) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_head_answers_the_headers_of_a_get_without_a_body(
    config: Config, template: Template
) -> None:
    p0 = template.partitions[0]
    with running(config) as daemon:
        url = (f"{daemon.server.url}/v1/topics/{DEMO_TOPIC}/partitions/0/records"
               f"?offset=0&max_bytes={len(p0.first_segment)}")
        status, headers, body = get_request(urllib.request.Request(url, method="HEAD"))
    assert (status, body) == (200, b"")
    assert int(headers["Content-Length"]) == len(p0.first_segment)
    assert headers["X-Source"] == "remote"


def test_many_concurrent_readers_get_the_right_batches(
    config: Config, template: Template
) -> None:
    rng = random.Random(5)
    requests = [(p, rng.randrange(template.partitions[p].end), rng.choice([1, 5_000, 300_000]))
                for p in range(DEMO_PARTITIONS) for _ in range(12)]

    def check(request: tuple[int, int, int]) -> None:
        partition, offset, max_bytes = request
        status, headers, body = records(daemon, partition, offset=offset, max_bytes=max_bytes)
        assert status == 200, body
        expected = template.partitions[partition].expected(offset, max_bytes)
        assert (body, int(headers["X-Next-Offset"])) == expected, request

    with running(config) as daemon, ThreadPoolExecutor(8) as pool:
        list(pool.map(check, requests))


# --- metrics ----------------------------------------------------------------------------------


def test_reader_and_cache_metrics_over_http(config: Config, template: Template) -> None:
    p0, p1 = template.partitions[0], template.partitions[1]
    seg = len(p0.first_segment)
    # read-ahead off: the counts below are the fetches' own (m1's second fetch would read
    # ahead into the next segment, on a thread of its own)
    config = dataclasses.replace(
        config, cluster={**config.cluster, "cloud_storage_chunk_prefetch": 0})
    with running(config) as daemon:
        # a consumer session holds the chunk it is positioned in: its next fetch is a hit
        offset, remote_bytes = 0, 0
        for _ in range(2):
            status, headers, body = records(daemon, 0, offset=offset, max_bytes=1,
                                            consumer="m1")
            assert (status, body) == (200, p0.expected(offset, 1)[0])
            offset, remote_bytes = int(headers["X-Next-Offset"]), remote_bytes + len(body)
        status, _, local = records(daemon, 0, offset=p0.local_start, max_bytes=1)
        assert status == 200
        # an anonymous fetch holds nothing afterwards: the eager strategy drops its chunk
        status, _, body = records(daemon, 1, offset=0, max_bytes=1)
        assert status == 200
        remote_bytes += len(body)
        assert records(daemon, 0, offset=p0.end)[0] == 416
        text = get(daemon.server.url + "/metrics")[2].decode()
    got = samples(text)

    def one(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    assert one("tiered_fetches_total", source="remote") == 3
    assert one("tiered_fetches_total", source="local") == 1
    assert one("tiered_fetch_bytes_total", source="remote") == remote_bytes
    assert one("tiered_fetch_bytes_total", source="local") == len(local)
    assert one("tiered_fetch_out_of_range_total") == 1
    assert one("tiered_cache_misses_total") == 2  # p0's first segment, p1's
    assert one("tiered_cache_hits_total") == 1  # m1's second fetch
    # each segment is one chunk (256 KiB < the 16 MiB chunk size)
    assert one("tiered_cache_downloaded_bytes_total") == seg + len(p1.first_segment)
    assert one("tiered_cache_evictions_total") == 1  # p1's, released after its fetch
    assert one("tiered_cache_hydrated_chunks") == 1  # m1's, still held
    assert one("tiered_cache_objects") == 1
    assert one("tiered_cache_size_bytes") == seg
    assert one("tiered_cache_readers") == 1
    assert one("tiered_cache_max_size_bytes") > 0
    assert one("tiered_remote_index_downloads_total") == 2  # one per segment opened
    for name in ("tiered_cache_joined_total", "tiered_cache_prefetches_total",
                 "tiered_cache_download_errors_total", "tiered_cache_corrupt_discarded_total",
                 "tiered_cache_overshoots_total", "tiered_cache_max_objects",
                 "tiered_timestamp_lookups_total", "tiered_remote_index_fallbacks_total"):
        assert (name, ()) in got, name
    # the archiver's families are still there (their samples come with the first rounds)
    assert "# TYPE tiered_daemon_job_runs_total counter" in text


# --- availability -----------------------------------------------------------------------------


class FlakyStore(ObjectStore):
    """A real store that fails every request while `down` (a network outage)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner.settings)
        self.inner = inner
        self.down = False

    def _check(self, op: str, key: str) -> None:
        if self.down:
            raise StoreError(f"{op} {key}: connection refused (simulated outage)")

    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None) -> str:
        self._check("PUT", key)
        return self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    def put_file(self, key: str, path: Path | str, *,
                 ready: Callable[[], None] | None = None,
                 byte_range: tuple[int, int] | None = None) -> str:
        self._check("PUT", key)
        return self.inner.put_file(key, path, ready=ready, byte_range=byte_range)

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        self._check("GET", key)
        return self.inner.get(key, byte_range)

    def head(self, key: str) -> ObjectInfo:
        self._check("HEAD", key)
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._check("LIST", prefix)
        return self.inner.list(prefix)

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        self._check("DELETE", "...")
        return self.inner.delete_many(keys)

    def close(self) -> None:
        self.inner.close()


def test_reads_go_on_while_the_store_is_unreachable_for_other_partitions(
    config: Config, template: Template
) -> None:
    p0, p1 = template.partitions[0], template.partitions[1]
    flaky: list[FlakyStore] = []

    @contextlib.contextmanager
    def new_reader(c: Config) -> Iterator[Reader]:
        store = FlakyStore(open_store(c.store_settings(), probe=False))
        flaky.append(store)
        # a clock that stands still: manifests stay as fresh as when first loaded, so what
        # this test shows does not depend on how fast it runs
        with store, Reader(c, store, local_log=LocalLog(c.log_dirs), clock=lambda: 0.0) as r:
            yield r

    with running(config, new_reader=new_reader) as daemon:
        status, headers, body = records(daemon, 0, offset=0, max_bytes=1, consumer="c1")
        assert (status, body) == (200, p0.expected(0, 1)[0])
        flaky[0].down = True
        # p0's consumer holds the chunk it is reading: its next fetch needs no store
        offset = int(headers["X-Next-Offset"])
        status, headers, body = records(daemon, 0, offset=offset, max_bytes=1, consumer="c1")
        assert (status, body, headers["X-Source"]) == (200, p0.expected(offset, 1)[0], "remote")
        # p1's old data needs the store: that request fails alone, as retryable
        status, _, body = records(daemon, 1, offset=0)
        error = json.loads(body)
        assert (status, error["error"]) == (503, "KAFKA_STORAGE_ERROR")
        assert "simulated outage" in error["message"]
        # p1's local data needs no store at all
        status, headers, body = records(daemon, 1, offset=p1.local_start, max_bytes=1)
        assert (status, headers["X-Source"]) == (200, "local")
        assert body == p1.expected(p1.local_start, 1)[0]
        assert get(daemon.server.url + "/metrics")[0] == 200
        # the store is back: so is p1's old data
        flaky[0].down = False
        status, _, body = records(daemon, 1, offset=0, max_bytes=1)
        assert (status, body) == (200, p1.expected(0, 1)[0])


def test_reads_are_served_while_the_archiver_waits_for_the_store(
    config: Config, template: Template
) -> None:
    p0 = template.partitions[0]

    attempted = threading.Event()

    def unreachable(c: Config) -> ObjectStore:
        attempted.set()
        raise StoreError("could not connect to http://127.0.0.1:1")

    with running(config, open_store=unreachable) as daemon:
        assert attempted.wait(30)  # the archiver is waiting for its store ...
        status, headers, body = records(daemon, 0, offset=p0.local_start, max_bytes=1)
        assert (status, headers["X-Source"]) == (200, "local")  # ... reads do not wait for it
        assert body == p0.expected(p0.local_start, 1)[0]
        status, _, body = records(daemon, 0, offset=0, max_bytes=1)  # the reader's own store
        assert (status, body) == (200, p0.expected(0, 1)[0])
        assert daemon.state.store_up is not True
        assert "upload" not in daemon.state.jobs


# --- lifecycle --------------------------------------------------------------------------------


def test_the_reader_opens_before_serving_and_closes_after_the_server_stops(
    config: Config,
) -> None:
    events: list[str] = []
    urls: list[str] = []

    @contextlib.contextmanager
    def new_reader(c: Config) -> Iterator[Reader]:
        with open_reader(c) as reader:
            events.append("opened")
            yield reader
            # the server stopped first: no request can reach a closed reader
            try:
                urllib.request.urlopen(urls[0] + "/health", timeout=5)
            except urllib.error.URLError:
                events.append("server already stopped")
        events.append("closed")

    daemon = Daemon(config, DaemonOptions(metrics_port=0), new_reader=new_reader)
    urls.append(daemon.server.url)
    assert daemon.reader is None
    with running_daemon(daemon):
        assert get(daemon.server.url + "/health")[0] == 200
        assert daemon.reader is not None
    assert events == ["opened", "server already stopped", "closed"]
    assert daemon.reader is None


@contextlib.contextmanager
def running_daemon(daemon: Daemon) -> Iterator[None]:
    thread = threading.Thread(target=daemon.run, name="daemon")
    thread.start()
    try:
        yield
    finally:
        daemon.request_stop("test over")
        thread.join(timeout=60)
        assert not thread.is_alive()


def test_without_a_reader_the_route_answers_503(config: Config) -> None:
    daemon = Daemon(config, DaemonOptions(metrics_port=0))
    try:
        status, headers, body = daemon._records("GET", "/v1/topics/orders/partitions/0/records",
                                                {"offset": ["0"]})
    finally:
        daemon.server.stop()
    assert (status, headers["Content-Type"]) == (503, "application/json")
    assert isinstance(body, bytes)
    assert json.loads(body)["error"] == "KAFKA_STORAGE_ERROR"


def test_an_unusable_cache_dir_is_a_clear_error_at_start(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    (tmp_path / "not-a-dir").write_text("a file where the cache should be")
    config = dataclasses.replace(demo_config(tmp_path), log_dirs=(tmp_path / "log",),
                                 cache_dir=tmp_path / "not-a-dir" / "cache")
    daemon = Daemon(config, DaemonOptions(metrics_port=0))
    with pytest.raises(TieredError, match="cache directory .*not-a-dir.*is not usable"):
        daemon.run()
    with pytest.raises(urllib.error.URLError):  # and the port was released
        urllib.request.urlopen(daemon.server.url + "/health", timeout=5)


def test_partition_fixture_matches_the_local_log(config: Config, template: Template) -> None:
    """The copy the tests read from is what the daemon sees: the local log starts where the
    fixture says, past offset 0 (so offset 0 can only come from the bucket)."""
    log = LocalLog(config.log_dirs)
    for p, part in template.partitions.items():
        local = log.partitions[TopicPartition(DEMO_TOPIC, p)]
        assert local.log_start_offset == part.local_start > 0
        assert local.log_end_offset() == part.end
