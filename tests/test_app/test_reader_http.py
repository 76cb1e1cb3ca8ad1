"""The remote-read HTTP endpoint (`tiered.app.http_api.handle_records`) behind a real
`http.server` on 127.0.0.1: status codes and Kafka error names for every failure a client can
cause (design invariant 9: a bad request gets a clear error and the server keeps serving)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support.remote import (
    TOPIC,
    Fixture,
    archived_partition,
    drop_local_segments,
    private_remote,
    record_timestamp,
    shared_remote,
)

from cache.reader import Reader
from manifests import keys
from tiered.app.health import Health
from tiered.app.http_api import handle_records
from tiered.app.http_server import HttpServer
from tiered.kafka.records import iter_batches


class _Server:
    """The daemon's HTTP server routing `/v1/` to `handle_records`, as the daemon does."""

    def __init__(self, reader: Reader) -> None:
        self.httpd = HttpServer(
            "127.0.0.1", 0, CollectorRegistry(), lambda: Health(200, {}),
            routes={"/v1/": lambda method, path, query: handle_records(
                reader, method, path, query)})
        self.httpd.start()
        self.url = self.httpd.url

    def get(self, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.url + path, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def close(self) -> None:
        self.httpd.stop()


@pytest.fixture
def server(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[_Server, Fixture]]:
    fx = shared_remote(tmp_path, tmp_path_factory)
    with fx.reader() as reader:
        srv = _Server(reader)
        try:
            yield srv, fx
        finally:
            srv.close()


def _records_path(partition: int = 0, topic: str = TOPIC) -> str:
    return f"/v1/topics/{topic}/partitions/{partition}/records"


def test_raw_format_returns_record_batches_as_kafka_sends_them(
    server: tuple[_Server, Fixture],
) -> None:
    srv, fx = server
    status, headers, body = srv.get(_records_path() + "?offset=7&max_bytes=900")
    assert status == 200
    assert headers["Content-Type"] == "application/octet-stream"
    assert body == fx.image.expected(7, 900)
    last = max(b.last_offset for b in iter_batches(body))
    assert headers["X-Next-Offset"] == str(last + 1)
    assert headers["X-Log-Start-Offset"] == "0"
    assert headers["X-High-Watermark"] == str(fx.end)
    assert headers["X-Source"] == "remote"


def test_jsonl_format_prints_one_record_a_line(server: tuple[_Server, Fixture]) -> None:
    srv, fx = server
    status, headers, body = srv.get(_records_path() + "?offset=20&max_bytes=2000&format=jsonl")
    assert status == 200
    assert headers["Content-Type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in body.decode().splitlines()]
    want = [r for b in iter_batches(fx.image.expected(20, 2000)) for r in b.records
            if r.offset >= 20]
    assert [line["offset"] for line in lines] == [r.offset for r in want]
    for line, record in zip(lines, want, strict=True):
        assert line["timestamp"] == record_timestamp(record.offset)
        assert line["key"] == (None if record.key is None
                               else base64.b64encode(record.key).decode())
        assert line["value"] == (None if record.value is None
                                 else base64.b64encode(record.value).decode())
        assert line["headers"] == [
            {"key": h.key, "value": None if h.value is None else base64.b64encode(h.value).decode()}
            for h in record.headers
        ]
    assert any(line["value"] is None for line in lines) or all(r.value for r in want)


def test_a_consumer_session_reads_the_log_in_order(server: tuple[_Server, Fixture]) -> None:
    srv, fx = server
    offset, pieces = 0, []
    while offset < fx.end:
        status, headers, body = srv.get(
            _records_path() + f"?offset={offset}&max_bytes=1500&consumer=c-1")
        assert status == 200
        pieces.append(body)
        offset = int(headers["X-Next-Offset"])
    assert b"".join(pieces) == b"".join(b[2] for b in fx.image.batches)


@pytest.mark.parametrize("query", [
    "", "?offset=", "?offset=abc", "?offset=-1", "?offset=1&max_bytes=x",
    "?offset=1&format=xml", "?offset=1&offset=2", "?offset=1&max_bytes=999999999999",
    "?offset=1&consumer=a/b", "?offset=1&consumer=" + "x" * 65,
])
def test_bad_parameters_are_400(server: tuple[_Server, Fixture], query: str) -> None:
    srv, _ = server
    status, headers, body = srv.get(_records_path() + query)
    assert status == 400
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body)["error"] == "INVALID_REQUEST"


@pytest.mark.parametrize("path", [
    "/v1/topics/..%2Fx/partitions/0/records?offset=0",
    "/v1/topics/orders/partitions/-1/records?offset=0",
    "/v1/topics/orders/partitions/zero/records?offset=0",
])
def test_hostile_names_are_400(server: tuple[_Server, Fixture], path: str) -> None:
    srv, _ = server
    status, _, body = srv.get(path)
    assert status == 400, body
    assert json.loads(body)["error"] == "INVALID_REQUEST"


def test_unknown_topic_or_partition_is_404(server: tuple[_Server, Fixture]) -> None:
    srv, _ = server
    for path in (_records_path(topic="nosuch") + "?offset=0",
                 _records_path(partition=5) + "?offset=0", "/v1/other"):
        status, _, body = srv.get(path)
        assert status == 404, path
        assert json.loads(body)["error"] == "UNKNOWN_TOPIC_OR_PARTITION"


def test_out_of_range_is_416_with_the_log_bounds(server: tuple[_Server, Fixture]) -> None:
    srv, fx = server
    status, _, body = srv.get(_records_path() + f"?offset={fx.end}")
    assert status == 416
    doc = json.loads(body)
    assert doc["error"] == "OFFSET_OUT_OF_RANGE"
    assert (doc["log_start_offset"], doc["log_end_offset"]) == (0, fx.end)
    assert str(fx.end) in doc["message"]
    # the server goes on serving after errors
    status, _, body = srv.get(_records_path() + "?offset=0&max_bytes=0")
    assert status == 200 and body == fx.image.expected(0, 0)


def test_other_methods_are_405_and_head_has_no_body(server: tuple[_Server, Fixture]) -> None:
    srv, _ = server
    status, headers, _ = srv.get(_records_path() + "?offset=0", method="POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    status, headers, body = srv.get(_records_path() + "?offset=0", method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0


def test_corrupt_data_is_500_corrupt_message(tmp_path: Path,
                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    fx = private_remote(tmp_path, tmp_path_factory)
    root = Path(fx.config.storage.url.removeprefix("file://"))
    names = [info.key for info in fx.store.list("") if info.key.endswith(".log")]
    last_key = max(names, key=lambda k: keys.parse_segment_name(  # type: ignore[union-attr]
        k.rsplit("/", 1)[1]).base_offset)
    target = root / last_key
    data = bytearray(target.read_bytes())
    data[-5] ^= 0x55
    target.write_bytes(bytes(data))
    last = fx.image.batches[-1]
    with fx.reader() as reader:
        srv = _Server(reader)
        try:
            status, _, body = srv.get(_records_path() + f"?offset={last[0]}&max_bytes=0")
            good_status, _, good = srv.get(_records_path() + "?offset=0&max_bytes=0")
        finally:
            srv.close()
    assert status == 500
    assert json.loads(body)["error"] == "CORRUPT_MESSAGE"
    assert (good_status, good) == (200, fx.image.expected(0, 0))


def test_remote_read_disabled_is_416(tmp_path: Path, file_store: Any) -> None:
    fx = archived_partition(tmp_path, file_store, batches=30,
                            topics={TOPIC: {"redpanda.remote.read": False}})
    drop_local_segments(fx.config)
    with fx.reader() as reader:
        status, _, body = handle_records(reader, "GET", _records_path(), {"offset": ["0"]})
    assert status == 416
    assert isinstance(body, bytes)
    assert "remote read is disabled" in json.loads(body)["message"]


# --- lookups by timestamp ----------------------------------------------------------------------


def _iso(ms: int) -> str:
    from tiered.config.units import format_timestamp_ms

    return format_timestamp_ms(ms)


def test_offsets_by_timestamp_in_ms_and_iso_8601(server: tuple[_Server, Fixture]) -> None:
    srv, fx = server
    path = f"/v1/topics/{TOPIC}/partitions/0/offsets"
    for when in (str(record_timestamp(40)), _iso(record_timestamp(40)),
                 str(record_timestamp(40) - 1)):  # between two records: the later one
        status, headers, body = srv.get(f"{path}?timestamp={when}")
        assert status == 200, body
        answer = json.loads(body)
        assert answer["offset"] == 40 and answer["partition"] == 0, answer
    status, _, body = srv.get(f"{path}?timestamp=0")
    assert status == 200 and json.loads(body)["offset"] == 0


def test_a_timestamp_past_the_end_says_so(server: tuple[_Server, Fixture]) -> None:
    srv, fx = server
    late = record_timestamp(fx.end) + 60_000
    status, _, body = srv.get(f"/v1/topics/{TOPIC}/partitions/0/offsets?timestamp={late}")
    assert status == 200
    answer = json.loads(body)
    assert answer["offset"] is None and answer["log_end_offset"] == fx.end
    assert "every record is older" in answer["message"]
    status, _, body = srv.get(_records_path() + f"?timestamp={late}")
    assert status == 416 and "every record is older" in json.loads(body)["message"]


def test_records_by_timestamp_start_at_the_first_record_at_or_after_it(
    server: tuple[_Server, Fixture],
) -> None:
    srv, fx = server
    status, headers, body = srv.get(
        _records_path() + f"?timestamp={_iso(record_timestamp(57))}&format=jsonl&max_bytes=500")
    assert status == 200, body
    lines = [json.loads(line) for line in body.decode().splitlines()]
    assert lines[0]["offset"] == 57 and lines[0]["timestamp"] == record_timestamp(57)


@pytest.mark.parametrize("query", ["", "?timestamp=2026-11-01T00:00:00",
                                   "?timestamp=yesterday", "?timestamp=5&timestamp=6"])
def test_bad_timestamp_lookups_are_400(server: tuple[_Server, Fixture], query: str) -> None:
    srv, _fx = server
    status, _, body = srv.get(f"/v1/topics/{TOPIC}/partitions/0/offsets{query}")
    assert status == 400 and json.loads(body)["error"] == "INVALID_REQUEST", body
    status, _, body = srv.get(_records_path() + "?offset=3&timestamp=5")
    assert status == 400 and "not both" in json.loads(body)["message"]
