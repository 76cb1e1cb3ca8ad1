"""Valid requests of every API and version the Kafka endpoint serves, built from kio's schema
and encoded with kio's writer: seeds for the frame checks' tests and the fuzzer."""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import uuid
from collections.abc import Iterator
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from tiered.app.kafka_api.apis import APIS
from tiered.app.kafka_api.messages import request_class

#: Metadata v12 (size prefix included), client "attacker", whose topics count is the varint
#: ff ff ff ff 0f: 31 bytes in all; kio asked for 32 GiB and aborted the process
METADATA_V12_ATTACK = (struct.pack(">ihhih", 27, 3, 12, 1, 8) + b"attacker" + b"\x00"
                       + b"\xff\xff\xff\xff\x0f" + b"\x00\x00\x00")
#: Metadata v1 (size prefix included) whose classic Int32 topics count is 2^31-1: kio asked
#: for 16 GiB, which aborts a process under a 4 GiB address-space limit
METADATA_V1_ATTACK = struct.pack(">ihhihsi", 15, 3, 1, 1, 1, b"x", 2**31 - 1)

#: a value of each fixed-size Kafka type, distinct from Kafka's defaults so tagged fields of
#: these types are written
_VALUES: dict[str, Any] = {
    "int8": 3, "uint8": 3, "int16": 7, "uint16": 7, "int32": 11, "uint32": 11, "int64": 13,
    "uint64": 13, "float64": 1.5, "bool": True, "error_code": ErrorCode.none,
    "timedelta_i32": datetime.timedelta(milliseconds=17),
    "timedelta_i64": datetime.timedelta(milliseconds=19),
    "datetime_i64": datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC),
}


def served() -> Iterator[tuple[int, int, type[Any]]]:
    """(api key, version, kio request class) of every version the endpoint serves."""
    for api in APIS.values():
        for version in range(api.min_version, api.max_version + 1):
            yield api.key, version, request_class(api.key, version)


def sample(cls: type[Any], *, full: bool, width: int = 2) -> Any:
    """An entity of `cls` with every field set: `full` gives arrays of `width` elements,
    optional fields and tagged fields a value; otherwise optional fields are null and arrays
    empty."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        shape = classify_field(f)
        tagged = get_field_tag(f) is not None
        if not full and (is_optional(f) or tagged):
            if tagged:
                continue  # the default: not written
            values[f.name] = None
            continue
        if isinstance(shape, EntityField | EntityTupleField):
            one: Any = lambda t=shape.type_: sample(t, full=full, width=width)  # noqa: E731
        else:
            one = _primitive(get_schema_field_type(f), f.name)
        if shape.is_array:
            values[f.name] = tuple(one() for _ in range(width if full else 0))
        else:
            values[f.name] = one()
    return cls(**values)


def _primitive(kafka_type: str, name: str) -> Any:
    if kafka_type == "string":
        return lambda: f"{name}-x"
    if kafka_type in ("bytes", "records"):
        return lambda: f"<{name}>".encode()
    if kafka_type == "uuid":
        return lambda: uuid.UUID(int=0x1234_5678)
    value = _VALUES[kafka_type]
    return lambda: value


def encode(entity: Any, *, correlation_id: int = 1, client_id: str | None = "fuzz") -> bytes:
    """The request frame of `entity`, without its size prefix."""
    cls = type(entity)
    header = cls.__header_schema__
    buf = io.BytesIO()
    entity_writer(header)(buf, header(request_api_key=cls.__api_key__,
                                      request_api_version=cls.__version__,
                                      correlation_id=correlation_id, client_id=client_id))
    entity_writer(cls)(buf, entity)
    return buf.getvalue()


def seeds() -> list[bytes]:
    """A full and an empty request of every served API and version, as frames."""
    out = []
    for _key, _version, cls in served():
        out.append(encode(sample(cls, full=True)))
        out.append(encode(sample(cls, full=False), client_id=None))
    return out


def sized(frame: bytes) -> bytes:
    """`frame` with its size prefix."""
    return struct.pack(">i", len(frame)) + frame
