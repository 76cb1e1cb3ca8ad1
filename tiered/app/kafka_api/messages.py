"""Building kio entities for any version of a message with one call.

kio generates one dataclass per message version from Kafka's JSON schemas, and fields come and
go between versions (`throttle_time` appears in v1, `topic_id` replaces `topic` in Fetch v13).
`build(cls, **fields)` takes the union of what every version of a message may carry: fields the
version does not have are dropped, and fields the caller does not give take the value Kafka's
own generated message classes default to (0, "", an empty array, null for a nullable field,
the nested struct's own defaults). So one handler answers every version it advertises, and a
field a version adds does not break the answer to that version.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import sys
import types
import typing
import uuid
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

__all__ = ["build", "nested", "request_class", "response_class"]

_ZERO_UUID = uuid.UUID(int=0)


@functools.cache
def response_class(api_key: int, version: int) -> type[Any]:
    """kio's response entity of `api_key` at `version`."""
    return load_response_schema(api_key, version)


@functools.cache
def request_class(api_key: int, version: int) -> type[Any]:
    """kio's request entity of `api_key` at `version`."""
    return load_request_schema(api_key, version)


def nested(owner: type[Any], name: str) -> type[Any]:
    """The nested entity `name` (e.g. "PartitionData") of the version `owner` belongs to."""
    cls = getattr(sys.modules[owner.__module__], name, None)
    if cls is None:
        raise LookupError(f"{owner.__module__} has no entity {name}")
    return typing.cast(type[Any], cls)


_FIELDS: dict[type[Any], tuple[dataclasses.Field[Any], ...]] = {}


def _fields(cls: type[Any]) -> tuple[dataclasses.Field[Any], ...]:
    found = _FIELDS.get(cls)
    if found is None:
        found = _FIELDS[cls] = dataclasses.fields(cls)
    return found


def build(cls: type[Any], **given: Any) -> Any:
    """An instance of the kio entity `cls` from `given` (unknown names dropped, missing ones
    defaulted as Kafka does)."""
    values: dict[str, Any] = {}
    for f in _fields(cls):
        if f.name in given:
            values[f.name] = given[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            values[f.name] = _zero(f.type)
    return cls(**values)


def _zero(tp: Any) -> Any:
    """Kafka's default for a field of type `tp`."""
    if isinstance(tp, types.UnionType) and type(None) in tp.__args__:
        return None
    if typing.get_origin(tp) is tuple:
        return ()
    if isinstance(tp, type):
        if issubclass(tp, ErrorCode):
            return ErrorCode.none
        if issubclass(tp, bool):
            return False
        if issubclass(tp, int):
            return 0
        if issubclass(tp, str):
            return ""
        if issubclass(tp, bytes):
            return b""
        if issubclass(tp, datetime.timedelta):
            return datetime.timedelta(0)
        if issubclass(tp, uuid.UUID):
            return _ZERO_UUID
        if dataclasses.is_dataclass(tp):
            return build(tp)
    raise TypeError(f"no Kafka default for a field of type {tp!r}")
