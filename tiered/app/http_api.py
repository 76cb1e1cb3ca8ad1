"""The remote-read HTTP endpoint, framework-free: the daemon's HTTP server routes here.

    GET /v1/topics/{topic}/partitions/{partition}/records?offset=O[&max_bytes=N][&format=F]
    GET /v1/topics/{topic}/partitions/{partition}/records?timestamp=T[&...]
    GET /v1/topics/{topic}/partitions/{partition}/offsets?timestamp=T

* `timestamp` (instead of `offset`): ms since the epoch or ISO-8601 with a zone; records start
  at the first one whose timestamp is >= T (416 when every record is older). `offsets` answers
  that offset alone as JSON, `"offset": null` with the log end when every record is older.

* `offset` (required): the first offset wanted; `max_bytes` (default 1 MiB, at most
  `MAX_FETCH_BYTES`): the byte budget, the first batch always comes whole; `format`:
  `raw` (default: the record batches byte for byte, as Kafka sends them) or `jsonl` (one JSON
  object a line per record: `offset`, `timestamp`, `key`, `value` (base64, null for null),
  `headers` (list of `{key, value}`, value base64 or null); transaction markers skipped and
  records before `offset` in the first batch dropped, as a consumer does); `consumer`
  (optional, 1-64 characters of `[A-Za-z0-9._-]`): names a consumer session, so the cache holds
  its position between requests, detects sequential reading and reads ahead.
* 200 carries `X-Next-Offset` (where to fetch next), `X-Log-Start-Offset`,
  `X-High-Watermark` and `X-Source` (`local`, `remote`, `remote+local`).
* Errors are JSON `{"error": NAME, "message": text}` with Kafka's error names where one fits:

  - 400 INVALID_REQUEST: a missing or malformed parameter, an illegal topic name;
  - 404 UNKNOWN_TOPIC_OR_PARTITION: neither the local log nor the bucket has it (or an
    unknown path);
  - 405 INVALID_REQUEST: a method other than GET / HEAD;
  - 416 OFFSET_OUT_OF_RANGE: the offset is below the log start or at / past its end (also when
    the data is only in the bucket and remote read is off); the body adds `log_start_offset`
    and `log_end_offset` when they are known;
  - 500 CORRUPT_MESSAGE: the fetch starts at stored bytes that failed their checksum
    (reported, never served); the body adds `path` (the file or object key) and `position`
    (its byte). A fetch whose range only reaches damage answers the intact batches before it;
  - 503 KAFKA_STORAGE_ERROR: the object store or the cache failed; retry later;
  - 500 UNKNOWN_SERVER_ERROR: a bug, logged with its traceback; other requests go on.

  416 (Range Not Satisfiable) is used for out-of-range offsets because the offset is a position
  in the log the way a byte range is one in a file, and a client can tell it from a bad request.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from cache.fetched_bytes import Pieces
from cache.reader import (
    DEFAULT_MAX_BYTES,
    FetchedPieces,
    FetchResult,
    InvalidRequest,
    Reader,
    UnknownPartition,
)
from tiered.config.units import UnitError, format_timestamp_ms, parse_timestamp_ms
from tiered.errors import CorruptSegmentError, OffsetOutOfRange, TieredError
from tiered.kafka.records import Record

__all__ = ["FORMATS", "MAX_FETCH_BYTES", "Response", "handle_records", "jsonl_lines"]

log = logging.getLogger(__name__)

#: (status, headers, body): a raw answer's body is the fetch's pieces, sent with sendfile
Response = tuple[int, dict[str, str], bytes | Pieces]

#: largest max_bytes one request may ask for (Kafka's fetch.max.bytes default is 50 MiB)
MAX_FETCH_BYTES = 64 << 20
_CONSUMER = re.compile(r"[A-Za-z0-9._-]{1,64}")
_PATH = re.compile(r"/v1/topics/([^/]+)/partitions/([^/]+)/records/?")
_OFFSETS_PATH = re.compile(r"/v1/topics/([^/]+)/partitions/([^/]+)/offsets/?")


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def record_json(record: Record) -> dict[str, Any]:
    """One record as the `jsonl` format prints it."""
    return {
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": _b64(record.key),
        "value": _b64(record.value),
        "headers": [{"key": h.key, "value": _b64(h.value)} for h in record.headers],
    }


def jsonl_lines(result: FetchResult) -> list[str]:
    """The records of a fetch, one compact JSON object each (no newline)."""
    return [json.dumps(record_json(r), separators=(",", ":")) for r in result.records()]


def _raw(result: FetchResult) -> bytes:
    return result.data


def _jsonl(result: FetchResult) -> bytes:
    return "".join(line + "\n" for line in jsonl_lines(result)).encode("utf-8")


#: format name -> (content type, body encoder)
FORMATS: dict[str, tuple[str, Callable[[FetchResult], bytes]]] = {
    "raw": ("application/octet-stream", _raw),
    "jsonl": ("application/x-ndjson", _jsonl),
}


def _error(status: int, name: str, message: str, **extra: Any) -> Response:
    body = json.dumps({"error": name, "message": message, **extra}).encode("utf-8")
    return status, {"Content-Type": "application/json"}, body


def _one(query: Mapping[str, Sequence[str]], name: str, default: str | None) -> str | None:
    values = query.get(name) or []
    if len(values) > 1:
        raise InvalidRequest(f"parameter {name!r} is given {len(values)} times")
    return values[0] if values else default


def _int(query: Mapping[str, Sequence[str]], name: str, default: int | None,
         upper: int | None = None) -> int:
    text = _one(query, name, None)
    if text is None:
        if default is None:
            raise InvalidRequest(f"parameter {name!r} is required")
        return default
    if not re.fullmatch(r"[0-9]{1,19}", text):
        raise InvalidRequest(f"parameter {name!r} must be a non-negative integer, got {text!r}")
    value = int(text)
    if upper is not None and value > upper:
        raise InvalidRequest(f"parameter {name!r} must be at most {upper}, got {value}")
    return value


def offset_at(reader: Reader, topic: str, partition: int, timestamp_ms: int) -> int:
    """The first offset whose record timestamp is >= `timestamp_ms`, from the local log or the
    bucket; OffsetOutOfRange naming the log end when every record is older."""
    found = reader.offset_for_timestamp(topic, partition, timestamp_ms)
    if found is None:
        end = reader.latest_offset(topic, partition)
        raise TimestampPastEnd(
            f"{topic}-{partition}: no record at or after timestamp {timestamp_ms} "
            f"({format_timestamp_ms(timestamp_ms)}): every record is older; the log end is "
            f"{end}")
    return found.offset


class TimestampPastEnd(OffsetOutOfRange):
    """Every record of the partition is older than the timestamp asked for."""


def _bounds(reader: Reader, topic: str, partition: int) -> dict[str, int]:
    """Best-effort log bounds for a 416 body (a failure here must not hide the 416)."""
    out: dict[str, int] = {}
    for name, get in (("log_start_offset", reader.earliest_offset),
                      ("log_end_offset", reader.latest_offset)):
        with contextlib.suppress(TieredError):
            out[name] = get(topic, partition)
    return out


def _topic_partition(match: re.Match[str]) -> tuple[str, int]:
    """The path's topic and partition, percent-decoded (UnicodeDecodeError when not UTF-8)."""
    topic = unquote(match.group(1), errors="strict")
    part_text = unquote(match.group(2), errors="strict")
    if not re.fullmatch(r"[0-9]{1,10}", part_text):
        raise InvalidRequest(f"partition must be a non-negative integer, got {part_text!r}")
    return topic, int(part_text)


def _timestamp(query: Mapping[str, Sequence[str]]) -> int | None:
    """`timestamp` (ms since the epoch, or ISO-8601 with a zone), None when absent."""
    text = _one(query, "timestamp", None)
    return None if text is None else parse_timestamp_ms(text)


def _start_offset(reader: Reader, topic: str, partition: int,
                  query: Mapping[str, Sequence[str]]) -> int:
    """`offset`, or the first offset at or after `timestamp`: exactly one of them."""
    wanted = _timestamp(query)
    if wanted is None:
        return _int(query, "offset", None)
    if _one(query, "offset", None) is not None:
        raise InvalidRequest("give either 'offset' or 'timestamp', not both")
    return offset_at(reader, topic, partition, wanted)


def _handle_offsets(reader: Reader, method: str, path: str, match: re.Match[str],
                    query: Mapping[str, Sequence[str]]) -> Response:
    """`GET .../offsets?timestamp=T`: the first offset whose record timestamp is >= T, from
    the local log or the bucket, as Kafka's ListOffsets answers. Every record older: 200 with
    `offset` null, the log end, and a message saying so (a lookup that found nothing, as
    ListOffsets' -1, not a failure)."""
    topic, partition = "", -1
    try:
        topic, partition = _topic_partition(match)
        wanted = _timestamp(query)
        if wanted is None:
            raise InvalidRequest("parameter 'timestamp' is required")
        answer: dict[str, Any] = {"topic": topic, "partition": partition, "timestamp": wanted}
        try:
            answer["offset"] = offset_at(reader, topic, partition, wanted)
        except TimestampPastEnd as exc:
            answer |= {"offset": None, "log_end_offset": reader.latest_offset(topic, partition),
                       "message": str(exc)}
    except (InvalidRequest, UnitError) as exc:
        return _error(400, "INVALID_REQUEST", str(exc))
    except UnicodeDecodeError:
        return _error(400, "INVALID_REQUEST", "the path is not UTF-8 once percent-decoded")
    except UnknownPartition as exc:
        return _error(404, "UNKNOWN_TOPIC_OR_PARTITION", str(exc))
    except OffsetOutOfRange as exc:  # the data is only in the bucket and remote read is off
        return _error(416, "OFFSET_OUT_OF_RANGE", str(exc))
    except TieredError as exc:
        log.warning("%s-%d: timestamp lookup failed: %s", topic, partition, exc)
        return _error(503, "KAFKA_STORAGE_ERROR", str(exc))
    except Exception:
        log.exception("%s-%d: unexpected error serving %s", topic, partition, path)
        return _error(500, "UNKNOWN_SERVER_ERROR", "internal error; see the daemon's log")
    body = json.dumps(answer).encode("utf-8")
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    return 200, headers, b"" if method == "HEAD" else body


def handle_records(
    reader: Reader, method: str, path: str, query: Mapping[str, Sequence[str]]
) -> Response:
    """Answer one request for `path` (no query string; `query` as `urllib.parse.parse_qs`
    returns it). Never raises for anything a client sends."""
    match = _PATH.fullmatch(path)
    offsets = _OFFSETS_PATH.fullmatch(path) if match is None else None
    if match is None and offsets is None:
        return _error(404, "UNKNOWN_TOPIC_OR_PARTITION", f"no such resource: {path}")
    if method not in ("GET", "HEAD"):
        status, headers, message = _error(405, "INVALID_REQUEST", f"method {method} not allowed")
        return status, {**headers, "Allow": "GET, HEAD"}, message
    if offsets is not None:
        return _handle_offsets(reader, method, path, offsets, query)
    assert match is not None
    topic, partition = "", -1
    try:
        topic, partition = _topic_partition(match)
        offset = _start_offset(reader, topic, partition, query)
        max_bytes = _int(query, "max_bytes", DEFAULT_MAX_BYTES, MAX_FETCH_BYTES)
        fmt = _one(query, "format", "raw")
        if fmt not in FORMATS:
            raise InvalidRequest(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        consumer = _one(query, "consumer", None)
        if consumer is not None and not _CONSUMER.fullmatch(consumer):
            raise InvalidRequest("consumer must be 1-64 characters of [A-Za-z0-9._-]")
        session = None if consumer is None else ("http", topic, partition, consumer)
        content_type, encode = FORMATS[fmt]
        body: bytes | Pieces
        result: FetchResult | FetchedPieces
        if fmt == "raw":  # the bytes stay where they are until the server sends them
            got = reader.fetch_pieces(topic, partition, offset, max_bytes, reader_id=session)
            result, body, size = got, got.pieces, got.pieces.size
        else:
            result = reader.fetch(topic, partition, offset, max_bytes, reader_id=session)
            body = encode(result)
            size = len(body)
    except (InvalidRequest, UnitError) as exc:
        return _error(400, "INVALID_REQUEST", str(exc))
    except UnicodeDecodeError:
        return _error(400, "INVALID_REQUEST", "the path is not UTF-8 once percent-decoded")
    except UnknownPartition as exc:
        return _error(404, "UNKNOWN_TOPIC_OR_PARTITION", str(exc))
    except OffsetOutOfRange as exc:
        return _error(416, "OFFSET_OUT_OF_RANGE", str(exc), **_bounds(reader, topic, partition))
    except CorruptSegmentError as exc:
        log.error("%s-%d: refusing corrupt data: %s", topic, partition, exc)
        return _error(500, "CORRUPT_MESSAGE", str(exc), path=exc.path, position=exc.position)
    except TieredError as exc:
        log.warning("%s-%d: read failed: %s", topic, partition, exc)
        return _error(503, "KAFKA_STORAGE_ERROR", str(exc))
    except Exception:
        log.exception("%s-%d: unexpected error serving %s", topic, partition, path)
        return _error(500, "UNKNOWN_SERVER_ERROR", "internal error; see the daemon's log")
    headers = {
        "Content-Type": content_type,
        "Content-Length": str(size),
        "X-Next-Offset": str(result.next_offset),
        "X-Source": result.source,
    }
    if result.log_start_offset is not None:
        headers["X-Log-Start-Offset"] = str(result.log_start_offset)
    if result.high_watermark is not None:
        headers["X-High-Watermark"] = str(result.high_watermark)
    if method == "HEAD":
        if isinstance(body, Pieces):
            body.close()
        return 200, headers, b""
    return 200, headers, body
