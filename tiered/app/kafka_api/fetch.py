"""Fetch: whole record batches as stored, local log first then the bucket, sent with sendfile
(docs/kafka-api.md, "Fetch").

Per request, as Kafka's broker:

* a partition named twice is answered once, where it was first named, with the fetch offset
  and byte limit it was last named with (Kafka's broker keeps a request's partitions in an
  insertion-ordered map);
* partitions are read in the order asked, each up to its `partition_max_bytes`, the whole
  response up to `max_bytes` capped by `[kafka] fetch_max_bytes` (the broker's
  fetch.max.bytes); the first batch of the first partition with data comes whatever its size
  (KIP-74), and a later partition whose first batch does not fit what is left sends nothing
  this time;
* one request reads at most `[kafka] max_partitions_per_fetch` partitions and holds at most
  `FetchLimits.max_chunk_files` chunk files of the read cache; the partitions past those
  bounds are answered without data or offsets (-1, "unknown", as Kafka's own error answers
  carry), and the connection's next request starts reading where this one stopped, so a
  client naming more partitions than the bound gets every one in turn;
* a fetch at the high watermark is no error: it waits, up to `max_wait`, until at least
  `min_bytes` are there (polled every `POLL_S`), then answers with what there is;
* `read_committed` (isolation level 1) adds the aborted transactions overlapping the batches
  sent, from the `.txnindex` of the local log and the bucket, when those batches hold any
  transactional batch (the consumer drops the aborted records itself);
* fetch sessions (KIP-227) are not offered: the answer's session id is 0, so clients send
  full requests; a request naming a session gets FETCH_SESSION_ID_NOT_FOUND.

The last stable offset reported is the high watermark: the sidecar keeps no producer state,
and the archiver only uploads data below the broker's high watermark.
"""

from __future__ import annotations

import datetime
import io
import logging
import os
import struct
import threading
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from cache.fetched_bytes import FilePiece, Pieces
from cache.reader import FetchedPieces, InvalidRequest, UnknownPartition
from manifests.security import Operation
from tiered.app.kafka_api.context import Connection, FetchLimits, Services, error_code_of
from tiered.app.kafka_api.fetch_response import (
    FIRST_TOPIC_ID,
    PartitionAnswer,
    TopicAnswer,
    encode_fetch_response,
)
from tiered.app.kafka_api.messages import build, nested, request_class
from tiered.app.kafka_api.wire import (
    Reply,
    Request,
    parse_request,
)
from tiered.errors import CorruptSegmentError, OffsetOutOfRange, TieredError
from tiered.kafka.records import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
    TRANSACTIONAL_MASK,
    any_batch_has,
)

__all__ = ["handle_fetch", "warm_up", "warm_up_in_background"]

log = logging.getLogger(__name__)

FETCH = 1
#: how often a fetch waiting at the log end looks for new data, seconds
POLL_S = 0.1
#: the longest a fetch waits for data, whatever the client asks (seconds)
MAX_WAIT_S = 30.0
READ_COMMITTED = 1
_LENGTH = struct.Struct(">i")
_ATTRIBUTES = struct.Struct(">h")


@dataclass
class _Partition:
    """One distinct partition of the request, and its part of the answer."""

    #: where the answer lists it: the topic as the request named it (name, or id from v13)
    topic_key: Any
    topic: Any
    name: str | None
    index: int
    fetch_offset: int
    max_bytes: int
    #: read this time (within the request's partition bound)
    read: bool = True
    #: the catalog knows no such topic or partition: answered without asking the store
    unknown: bool = False
    error: ErrorCode = ErrorCode.none
    high_watermark: int = -1
    log_start_offset: int = -1
    aborted: tuple[tuple[int, int], ...] | None = None
    pieces: Pieces | None = None

    def reset(self) -> None:
        """Back to unanswered, its pieces closed (before reading again)."""
        if self.pieces is not None:
            self.pieces.close()
        self.pieces, self.aborted = None, None
        self.error, self.high_watermark, self.log_start_offset = ErrorCode.none, -1, -1


def handle_fetch(svc: Services, conn: Connection, req: Request) -> Reply:
    body, v = req.body, req.api_version
    if getattr(body, "session_id", 0) != 0 or getattr(body, "session_epoch", -1) > 0:
        return Reply(encode_fetch_response(
            v, req.correlation_id, (), error_code=ErrorCode.fetch_session_id_not_found.value))
    limits = svc.fetch_limits
    answer = _distinct(svc, body, v)
    _bound(conn, answer, limits.max_partitions)
    read_committed = body.isolation_level == READ_COMMITTED
    wait_s = min(body.max_wait.total_seconds(), MAX_WAIT_S)
    deadline = svc.clock() + max(0.0, wait_s)
    try:
        while True:
            total, errors = _read_all(svc, conn, body, limits, answer, read_committed)
            if (total >= body.min_bytes or errors or svc.clock() >= deadline
                    or svc.stopping.is_set()):
                break
            _close(answer)  # nothing worth sending yet: wait at the log end and read again
            svc.stopping.wait(min(POLL_S, max(0.0, deadline - svc.clock())))
        return _reply(req, answer)
    except BaseException:
        _close(answer)
        raise


def warm_up(versions: Iterable[int]) -> None:
    """Load what reading a Fetch request of each of `versions` takes, by parsing one of each
    (answers are encoded by hand, `fetch_response`): kio's generated classes of every Fetch
    version are imported on first use, and their readers and frame checks built then, a fifth of a
    second of interpreter (docs/performance.md, `kafka_read.py`). The server runs this on a
    thread of its own when it starts, so a consumer's first Fetch does not pay for it."""
    for v in versions:
        req_cls = request_class(FETCH, v)
        head_cls = req_cls.__header_schema__
        frame = io.BytesIO()
        entity_writer(head_cls)(frame, build(
            head_cls, request_api_key=FETCH, request_api_version=v, correlation_id=0,
            client_id="tiered-warm-up"))
        partition = build(nested(req_cls, "FetchPartition"), partition=0, fetch_offset=0,
                          partition_max_bytes=1)
        topic = build(nested(req_cls, "FetchTopic"), topic="t", partitions=(partition,))
        entity_writer(req_cls)(frame, build(
            req_cls, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=1,
            max_bytes=1, session_epoch=-1, topics=(topic,)))
        parse_request(frame.getvalue())


def warm_up_in_background(versions: Iterable[int]) -> threading.Thread:
    """`warm_up` on a daemon thread of its own (started; returned so a caller may join it). A
    failure is logged, never raised: the first Fetch then loads what it needs itself."""

    def run() -> None:
        try:
            warm_up(versions)
        except Exception:
            log.exception("preparing the Fetch messages ahead failed; the first Fetch will")

    thread = threading.Thread(target=run, name="kafka-fetch-warm-up", daemon=True)
    thread.start()
    return thread


def _distinct(svc: Services, body: Any, version: int) -> list[_Partition]:
    """The request's partitions, each once: where it was first named, with what it was last
    named with (a broker's insertion-ordered map of the request's partitions)."""
    seen: dict[tuple[Any, int], _Partition] = {}
    names: dict[Any, str | None] = {}
    for t in body.topics:
        key = t.topic_id if version >= 13 else str(t.topic)
        if key not in names:
            names[key] = svc.catalog.name_of(t.topic_id) if version >= 13 else key
        for p in t.partitions:
            old = seen.get((key, p.partition))
            if old is not None:
                old.fetch_offset, old.max_bytes = p.fetch_offset, p.partition_max_bytes
                continue
            seen[(key, p.partition)] = _Partition(key, t, names[key], p.partition,
                                                  p.fetch_offset, p.partition_max_bytes)
    answer = list(seen.values())
    _mark_unknown(svc, answer)
    return answer


def _mark_unknown(svc: Services, answer: list[_Partition]) -> None:
    """Mark the partitions the catalog does not know, once per request: a Fetch naming
    thousands of topics that do not exist costs no store request per name (docs/kafka-api.md,
    "The topic catalog"). While the bucket has never been read nobody can tell: the read
    answers, as before."""
    local = svc.catalog.local_topics()
    counts: dict[str, int | None] = {}
    for out in answer:
        if out.name is None:
            continue
        if out.name not in counts:
            try:
                topic = svc.catalog.topic(out.name, local)
            except TieredError:
                counts[out.name] = None
                continue
            counts[out.name] = 0 if topic is None else topic.partitions
        count = counts[out.name]
        out.unknown = count is not None and not 0 <= out.index < count


def _bound(conn: Connection, answer: list[_Partition], most: int) -> None:
    """Read at most `most` of the partitions, starting where the connection's previous
    request stopped: each gets its turn however many a client names."""
    if len(answer) <= most:
        conn.fetch_cursor = 0
        return
    start = conn.fetch_cursor % len(answer)
    chosen = {(start + i) % len(answer) for i in range(most)}
    for i, out in enumerate(answer):
        out.read = i in chosen
    conn.fetch_cursor = (start + most) % len(answer)


def _read_all(svc: Services, conn: Connection, body: Any, limits: FetchLimits,
              answer: list[_Partition], read_committed: bool) -> tuple[int, bool]:
    """Fill `answer`; returns the bytes read and whether some partition has an error."""
    budget = min(max(0, body.max_bytes), limits.max_bytes)
    total, files, errors, first = 0, 0, False, True
    for out in answer:
        if not out.read:
            continue
        if out.name is None:
            out.error, errors = ErrorCode.unknown_topic_id, True
            continue
        if not svc.guard.topic(conn, Operation.READ, out.name):
            out.error, errors = ErrorCode.topic_authorization_failed, True
            continue
        if out.unknown:
            out.error, errors = ErrorCode.unknown_topic_or_partition, True
            continue
        limit = min(max(0, out.max_bytes), budget - total)
        if files >= limits.max_chunk_files:
            limit, first = 0, False  # no chunk file left to read through: offsets only
        _read_one(svc, conn, out.name, out.fetch_offset, limit, first, read_committed, out,
                  limits.max_chunk_files - files)
        if out.error is not ErrorCode.none:
            errors = True
        elif out.pieces is not None:
            total += out.pieces.size
            files += out.pieces.files
            first = False
    return total, errors


def _read_one(svc: Services, conn: Connection, topic: str, offset: int, limit: int,
              first: bool, read_committed: bool, out: _Partition, max_files: int) -> None:
    reader = svc.reader
    where = f"{topic}-{out.index}"
    got: FetchedPieces | None = None
    known = len(conn.sessions)
    session: Hashable | None = None
    try:
        if limit <= 0 and not first:
            _bounds(svc, topic, out)
            return
        session = conn.session(topic, out.index)
        got = reader.fetch_pieces(topic, out.index, offset, limit, reader_id=session,
                                  max_files=max(1, max_files))
    except OffsetOutOfRange as exc:
        _bounds(svc, topic, out)
        if out.error is ErrorCode.none and offset != out.high_watermark:
            out.error = error_code_of(exc, where)
        return
    except TieredError as exc:
        out.error = error_code_of(exc, where)
        if isinstance(exc, (UnknownPartition, InvalidRequest)) and len(conn.sessions) > known:
            # named by the client, never read: a connection naming ever new partitions that
            # do not exist must not grow its session set
            conn.sessions.discard(session)
        return
    out.high_watermark = got.high_watermark if got.high_watermark is not None else -1
    out.log_start_offset = got.log_start_offset if got.log_start_offset is not None else -1
    if got.pieces.size > limit and not first:
        got.close()  # its first batch does not fit what the request has left
        return
    out.pieces = got.pieces
    if read_committed:
        try:
            if _any_transactional(got.pieces):
                found = reader.aborted_transactions(topic, out.index, offset, got.next_offset)
                out.aborted = tuple((t.producer_id, t.first_offset) for t in found)
            else:
                out.aborted = ()
        except TieredError as exc:
            got.close()
            out.pieces = None
            out.error = error_code_of(exc, where)


def _bounds(svc: Services, topic: str, out: _Partition) -> None:
    """The partition's high watermark and log start, for an answer without data."""
    try:
        out.high_watermark = svc.reader.latest_offset(topic, out.index)
        out.log_start_offset = svc.reader.earliest_offset(topic, out.index)
    except TieredError as exc:
        out.error = error_code_of(exc, f"{topic}-{out.index}")


def _any_transactional(pieces: Pieces) -> bool:
    """Whether a batch of `pieces` (each part whole batches) is transactional: its headers
    are read where they lie (a few bytes per batch), from the chunk's mapping when the piece
    has one. Parts that do not walk as whole batches (never expected: they were checked
    before they were served) count as transactional: the aborted transactions are then
    looked up, which costs a lookup, never a wrong answer."""
    try:
        for part in pieces.parts:
            if not isinstance(part, FilePiece):
                found = any_batch_has(part, TRANSACTIONAL_MASK)
            elif part.mapping is not None:
                found = any_batch_has(part.mapping, TRANSACTIONAL_MASK, part.offset,
                                      part.offset + part.length)
            else:
                found = _file_any_transactional(part)
            if found:
                return True
    except (CorruptSegmentError, ValueError):
        return True
    return False


def _file_any_transactional(part: FilePiece) -> bool:
    """`_any_transactional` of a file range without a mapping, a header read at a time;
    lengths checked against the range as `any_batch_has` checks them."""
    pos, end = part.offset, part.offset + part.length
    while pos < end:
        head = os.pread(part.fd, ATTRIBUTES_OFFSET + _ATTRIBUTES.size, pos)
        if end - pos < BATCH_HEADER.size or len(head) < ATTRIBUTES_OFFSET + _ATTRIBUTES.size:
            raise CorruptSegmentError("truncated batch header", position=pos)
        length = _LENGTH.unpack_from(head, LENGTH_OFFSET)[0]
        if length < MIN_BATCH_LENGTH or pos + LOG_OVERHEAD + length > end:
            raise CorruptSegmentError(f"bad batch length {length}", position=pos)
        if _ATTRIBUTES.unpack_from(head, ATTRIBUTES_OFFSET)[0] & TRANSACTIONAL_MASK:
            return True
        pos += LOG_OVERHEAD + length
    return False


def _reply(req: Request, answer: list[_Partition]) -> Reply:
    """The answer: one entry per distinct partition, consecutive partitions of one topic
    under one topic entry (as Kafka's FetchResponse groups them), encoded by hand
    (`fetch_response`: it is on a catching-up consumer's critical path)."""
    topics: list[TopicAnswer] = []
    run: list[PartitionAnswer] = []
    head: _Partition | None = None
    for out in answer:
        if head is None or head.topic_key != out.topic_key:
            if head is not None:
                topics.append(_topic(req.api_version, head, run))
            head, run = out, []
        run.append(PartitionAnswer(
            out.index, out.error.value, out.high_watermark, out.log_start_offset, out.aborted,
            out.pieces if out.pieces is not None and out.pieces.size else None))
    if head is not None:
        topics.append(_topic(req.api_version, head, run))
    reply = Reply(encode_fetch_response(req.api_version, req.correlation_id, topics))
    for out in answer:  # empty pieces the reply does not carry
        if out.pieces is not None and not out.pieces.size:
            out.pieces.close()
    return reply


def _topic(version: int, head: _Partition, partitions: list[PartitionAnswer]) -> TopicAnswer:
    if version >= FIRST_TOPIC_ID:
        return TopicAnswer(None, head.topic.topic_id, partitions)
    return TopicAnswer(head.name, None, partitions)


def _close(answer: list[_Partition]) -> None:
    for out in answer:
        out.reset()
