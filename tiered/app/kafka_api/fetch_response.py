"""The Fetch response, encoded by hand for every version served (4..18), with each partition's
record bytes left where they lie (docs/kafka-api.md, "Fetch").

A consumer catching up sends one Fetch after another, each answered while it waits, so the
time to build an answer is on its critical path. Built through kio's generic entity writer,
an answer of one partition took about as long as parsing the request and reading the
batches together; its layout is fixed and small, so it is written here directly, field by
field as Kafka's FetchResponse.json orders them (tests/test_app compare it byte for byte
with kio's encoding of every version):

    ResponseHeader  correlation_id Int32, then (v12+, flexible) an empty tagged-field section
    throttle_time_ms Int32, error_code Int16 (v7+), session_id Int32 (v7+)
    responses [topic (v4..12: String) or topic_id (v13+: Uuid),
               partitions [partition_index Int32, error_code Int16, high_watermark Int64,
                           last_stable_offset Int64, log_start_offset Int64 (v5+),
                           aborted_transactions nullable [producer_id Int64,
                                                          first_offset Int64],
                           preferred_read_replica Int32 (v11+), records nullable Bytes]]

Flexible versions write arrays, strings and bytes with unsigned-varint lengths (length + 1;
0 for null) and end every structure with an empty tagged-field section: none of the tagged
fields (diverging epoch, current leader, snapshot id, node endpoints) is ever sent by a
read-only sidecar that leads everything it serves.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from cache.fetched_bytes import Pieces
from tiered.kafka.varint import append_uvarint

__all__ = ["FIRST_FLEXIBLE", "PartitionAnswer", "TopicAnswer", "encode_fetch_response"]

#: the first flexible Fetch version (compact lengths and tagged fields)
FIRST_FLEXIBLE = 12
#: the first version naming topics by id
FIRST_TOPIC_ID = 13

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
#: partition_index, error_code, high_watermark, last_stable_offset
_PARTITION_HEAD = struct.Struct(">ihqq")
_I64 = struct.Struct(">q")
_ABORTED = struct.Struct(">qq")
_FRAME_SIZE = struct.Struct(">i")
#: throttle_time_ms, error_code, session_id (v7+)
_TOP_V7 = struct.Struct(">ihi")
_NO_TAGS = b"\x00"


@dataclass(frozen=True, slots=True)
class PartitionAnswer:
    """One partition of the answer; `records` None or empty: no record bytes (an empty
    records field, not a null one, as Kafka's broker sends)."""

    index: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    #: (producer id, first offset) of the aborted transactions; None: the field is null
    aborted: tuple[tuple[int, int], ...] | None
    records: Pieces | None


@dataclass(frozen=True, slots=True)
class TopicAnswer:
    """One topic entry: its name (v4..12) or id (v13+), and its partitions in order."""

    name: str | None
    topic_id: uuid.UUID | None
    partitions: Sequence[PartitionAnswer]


def encode_fetch_response(version: int, correlation_id: int, topics: Sequence[TopicAnswer],
                          *, error_code: int = 0, session_id: int = 0
                          ) -> list[bytes | Pieces]:
    """The whole response frame (size prefix included) as encoded bytes and the record
    pieces between them, in order, ready for `Reply`."""
    if not 4 <= version <= 18:
        raise ValueError(f"Fetch v{version} is not served")
    flexible = version >= FIRST_FLEXIBLE
    out = bytearray(_I32.pack(correlation_id))
    if flexible:
        out += _NO_TAGS
    out += _TOP_V7.pack(0, error_code, session_id) if version >= 7 else _I32.pack(0)
    _length(out, len(topics), flexible)
    parts: list[bytes | Pieces] = []
    for topic in topics:
        if version >= FIRST_TOPIC_ID:
            if topic.topic_id is None:
                raise ValueError(f"Fetch v{version} names topics by id")
            out += topic.topic_id.bytes
        else:
            if topic.name is None:
                raise ValueError(f"Fetch v{version} names topics by name")
            name = topic.name.encode("utf-8")
            _length(out, len(name), flexible, _I16)
            out += name
        _length(out, len(topic.partitions), flexible)
        for p in topic.partitions:
            out += _PARTITION_HEAD.pack(p.index, p.error_code, p.high_watermark,
                                        p.high_watermark)
            if version >= 5:
                out += _I64.pack(p.log_start_offset)
            _length(out, -1 if p.aborted is None else len(p.aborted), flexible)
            if p.aborted is not None:
                for producer_id, first_offset in p.aborted:
                    out += _ABORTED.pack(producer_id, first_offset)
                    if flexible:
                        out += _NO_TAGS
            if version >= 11:
                out += _I32.pack(-1)  # preferred_read_replica: none
            size = 0 if p.records is None else p.records.size
            _length(out, size, flexible)
            if size:
                assert p.records is not None  # noqa: S101 - size is 0 without records
                parts.append(bytes(out))
                parts.append(p.records)
                out = bytearray()
            if flexible:
                out += _NO_TAGS
        if flexible:
            out += _NO_TAGS
    if flexible:
        out += _NO_TAGS
    parts.append(bytes(out))
    total = sum(len(x) if isinstance(x, bytes) else x.size for x in parts)
    head = parts[0]
    assert isinstance(head, bytes)  # noqa: S101 - the header is always first
    parts[0] = _FRAME_SIZE.pack(total) + head
    return parts


def _length(out: bytearray, n: int, flexible: bool, fixed: struct.Struct = _I32) -> None:
    """A length (an array's count, a string's or bytes' size; -1: null) as the version writes
    it: the unsigned varint of n + 1 in flexible versions (0: null), else `fixed`-width."""
    if flexible:
        append_uvarint(out, n + 1)
    else:
        out += fixed.pack(n)
