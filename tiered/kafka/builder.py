"""Building Kafka record batches v2: the writer's half of `tiered.kafka.records`.

`encode_batch` produces a batch byte for byte as a broker stores it (CRC-32C over attributes
to the end, offsets and timestamps as deltas, the codec applied to the records as one blob);
the local log writer, the demo and the tests build logs with it. Reading is
`tiered.kafka.records`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import crc32c

from tiered.kafka.compression import codec_by_name
from tiered.kafka.records import (
    _CONTROL_TYPE_IDS,
    _CRC,
    _TIMESTAMP_TYPE_BITS,
    ATTRIBUTES_OFFSET,
    BATCH_HEADER,
    CONTROL_KEY,
    CONTROL_MASK,
    CONTROL_VALUE,
    CRC_OFFSET,
    DELETE_HORIZON_MASK,
    LOG_OVERHEAD,
    MAGIC_V2,
    TRANSACTIONAL_MASK,
    Record,
)
from tiered.kafka.varint import append_varint, append_varlong


def encode_batch(
    records: Sequence[Record],
    *,
    base_offset: int,
    compression: str = "none",
    timestamp_type: str = "create",
    partition_leader_epoch: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
    max_timestamp: int | None = None,
    delete_horizon_ms: int | None = None,
) -> bytes:
    """Encode `records` as one v2 batch, exactly as a broker would store it.

    Record offsets must be strictly increasing and at or above `base_offset` (gaps are fine, as
    after compaction); timestamps are stored as deltas from the first record's, or from
    `delete_horizon_ms` when given (which also sets the delete-horizon attribute).
    `max_timestamp` defaults to the largest record timestamp; for `log_append` batches pass the
    broker's append time. Raises ValueError for input that cannot be encoded."""
    if not records:
        raise ValueError("a batch needs at least one record")
    if timestamp_type not in _TIMESTAMP_TYPE_BITS:
        raise ValueError(
            f"unknown timestamp type {timestamp_type!r} (known: {', '.join(_TIMESTAMP_TYPE_BITS)})"
        )
    if transactional and producer_id < 0:
        raise ValueError("a transactional batch needs a producer id")
    if control and any(r.key is None or len(r.key) < CONTROL_KEY.size for r in records):
        raise ValueError("control records need a version + type key (see control_record)")
    codec = codec_by_name(compression)
    base_timestamp = records[0].timestamp if delete_horizon_ms is None else delete_horizon_ms
    body = _encode_records(records, base_offset, base_timestamp)
    last_offset_delta = records[-1].offset - base_offset

    attributes = (
        codec.codec_id
        | _TIMESTAMP_TYPE_BITS[timestamp_type]
        | (TRANSACTIONAL_MASK if transactional else 0)
        | (CONTROL_MASK if control else 0)
        | (DELETE_HORIZON_MASK if delete_horizon_ms is not None else 0)
    )
    out = bytearray(BATCH_HEADER.size)
    out += codec.compress(body)
    try:
        BATCH_HEADER.pack_into(
            out,
            0,
            base_offset,
            len(out) - LOG_OVERHEAD,
            partition_leader_epoch,
            MAGIC_V2,
            0,  # the CRC covers the header after it: computed below
            attributes,
            last_offset_delta,
            base_timestamp,
            max(r.timestamp for r in records) if max_timestamp is None else max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            len(records),
        )
    except struct.error as err:
        raise ValueError(f"a batch header field is out of range: {err}") from None
    _CRC.pack_into(out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def _encode_records(records: Sequence[Record], base_offset: int, base_timestamp: int) -> bytes:
    body = bytearray()
    record = bytearray()
    prev_offset = base_offset - 1
    for r in records:
        if r.offset <= prev_offset:
            raise ValueError(
                f"record offset {r.offset} is not above the previous one ({prev_offset}) "
                f"or below base offset {base_offset}"
            )
        prev_offset = r.offset
        if not 0 <= r.attributes <= 0xFF:
            raise ValueError(f"record attributes {r.attributes} do not fit one byte")
        record.clear()
        record.append(r.attributes)
        append_varlong(record, r.timestamp - base_timestamp)
        append_varint(record, r.offset - base_offset)
        _append_nullable(record, r.key)
        _append_nullable(record, r.value)
        append_varint(record, len(r.headers))
        for h in r.headers:
            _append_nullable(record, h.key.encode("utf-8"))
            _append_nullable(record, h.value)
        append_varint(body, len(record))
        body += record
    return bytes(body)


def _append_nullable(out: bytearray, data: bytes | None) -> None:
    if data is None:
        append_varint(out, -1)
    else:
        append_varint(out, len(data))
        out += data


def make_records(
    values: Iterable[bytes | None],
    *,
    base_offset: int,
    timestamp: int,
    keys: Iterable[bytes | None] | None = None,
    timestamp_step: int = 1,
) -> list[Record]:
    """Records with consecutive offsets from `base_offset` and timestamps from `timestamp` (ms)
    `timestamp_step` apart: test and demo data. `keys` defaults to all-null."""
    values = list(values)
    key_list = [None] * len(values) if keys is None else list(keys)
    if len(key_list) != len(values):
        raise ValueError(f"{len(key_list)} keys for {len(values)} values")
    return [
        Record(base_offset + i, timestamp + i * timestamp_step, key, value)
        for i, (key, value) in enumerate(zip(key_list, values, strict=True))
    ]


def control_record(
    kind: str, coordinator_epoch: int, *, offset: int = 0, timestamp: int = 0
) -> Record:
    """A transaction marker record ("commit" or "abort") for a control batch: encode it with
    `encode_batch(..., control=True, transactional=True)` as the transaction coordinator does."""
    if kind not in ("commit", "abort"):
        raise ValueError(f"control record kind must be 'commit' or 'abort', not {kind!r}")
    return Record(
        offset,
        timestamp,
        CONTROL_KEY.pack(0, _CONTROL_TYPE_IDS[kind]),
        CONTROL_VALUE.pack(0, coordinator_epoch),
    )
