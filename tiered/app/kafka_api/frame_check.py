"""Every length and count in a request frame checked against the bytes left, before kio reads
it (docs/kafka-api.md, "Limits and security").

kio's native reader allocates room for an array as soon as it has read the array's count: a
Metadata v12 request of 31 bytes whose topics count is the varint `ff ff ff ff 0f` makes it
ask for 32 GiB, and the failed allocation aborts the whole process. So `check_request` walks
the frame first, with the layout kio's writer gives the request's class (the dataclass fields
of kio's schema, in order, their `kafka_type`, nested entities, tagged fields in flexible
versions), and refuses a frame in which any count or length cannot fit in what is left:

* an array of N elements needs at least N times the smallest encoding of one element (at least
  one byte each, as Kafka's own readers demand), a string or bytes of N bytes needs N bytes;
* varints are at most 5 bytes; a length below -1 (null) is refused;
* tagged fields: each needs at least two bytes (tag and size), a size must fit, and a known
  tagged field is walked inside its size;
* a null (count or length -1) only where the schema allows one: kio would read it into a
  field the handlers take to be never None, as Kafka's own readers refuse it;
* the walk must end exactly at the end of the frame.

The walk reads nothing into memory but positions, so a frame's check costs time linear in its
size and no more memory than its nesting. It does not judge other values (kio and the
handlers do); only that every element kio will allocate is backed by bytes of the frame.

The layout comes from kio's own introspection of its schema classes (`kio.serial._introspect`,
what its writer uses); the tests walk a request of every served API and version as kio writes
it, so a kio whose layout differs fails them rather than the endpoint.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

__all__ = ["FrameError", "check_request"]


class FrameError(ValueError):
    """A count or length in a request frame that its bytes cannot hold, or a frame whose
    fields do not end where it ends."""


#: bytes of each fixed-size Kafka type kio knows
_FIXED = {"int8": 1, "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "error_code": 2,
          "int32": 4, "uint32": 4, "timedelta_i32": 4, "int64": 8, "uint64": 8, "float64": 8,
          "timedelta_i64": 8, "datetime_i64": 8, "uuid": 16}
#: a varint of a 32-bit value is at most this many bytes
_MAX_VARINT = 5

# what one value of a field is
_FIXED_KIND, _STRING, _BYTES, _ENTITY, _NULLABLE_ENTITY = range(5)


@dataclass(frozen=True)
class _Entity:
    name: str
    flexible: bool
    fields: tuple[_Field, ...]
    tagged: dict[int, _Field]
    #: the fewest bytes the entity can take
    min_size: int
    #: bytes of the entity when every encoding of it has the same size (fixed-size fields
    #: only, not flexible); else None
    fixed: int | None = None


@dataclass(frozen=True)
class _Field:
    name: str
    kind: int
    #: the field is an array of values of `kind`
    array: bool
    #: compact (varint) lengths: the owner's version is flexible (never the header's client_id)
    compact: bool
    #: bytes of a fixed-size value
    size: int = 0
    entity: _Entity | None = None
    #: the field may be null (an array: the array itself); `items_nullable`: its elements
    nullable: bool = True
    items_nullable: bool = False

    def min_value(self) -> int:
        """The fewest bytes one value can take."""
        if self.kind == _FIXED_KIND:
            return self.size
        if self.kind in (_STRING, _BYTES):
            return 1 if self.compact else (2 if self.kind == _STRING else 4)
        if self.kind == _NULLABLE_ENTITY or self.entity is None:
            return 1
        return self.entity.min_size

    def min_size(self) -> int:
        """The fewest bytes the field can take (an array: its count)."""
        if self.array:
            return 1 if self.compact else 4
        return self.min_value()


_COMPILED: dict[tuple[type[Any], bool], _Entity] = {}


def _compile(cls: type[Any], header: bool = False) -> _Entity:
    """The layout kio's `entity_writer` gives `cls` (kio/serial/_serialize.py), once per
    class (a race compiles it twice, to the same result)."""
    found = _COMPILED.get((cls, header))
    if found is None:
        found = _COMPILED[(cls, header)] = _compile_now(cls, header)
    return found


def _compile_now(cls: type[Any], header: bool) -> _Entity:
    flexible = bool(cls.__flexible__)
    fields: list[_Field] = []
    tagged: dict[int, _Field] = {}
    for f in dataclasses.fields(cls):
        tag = get_field_tag(f)
        name = f"{cls.__name__}.{f.name}"
        shape = classify_field(f)
        array = shape.is_array
        # kio reads a null where the schema has none, and the handlers would meet a None
        # they cannot have: Kafka refuses such a request. Tagged fields may be left null.
        nullable = tag is not None or _optional(f.type)
        items = (array and _optional(typing.get_args(_strip_none(f.type))[0]))
        if isinstance(shape, EntityField | EntityTupleField):
            nested = _compile(shape.type_)
            # a tagged entity is written without a null marker; a nullable array's null is
            # its count, not a marker
            marked = not array and tag is None and is_optional(f)
            field = _Field(name, _NULLABLE_ENTITY if marked else _ENTITY, array, flexible,
                           entity=nested, nullable=nullable, items_nullable=items)
        else:
            kafka_type = get_schema_field_type(f)
            if kafka_type == "string":
                # Kafka writes the header's client_id as a classic string in every version
                compact = flexible and not (header and f.name == "client_id")
                field = _Field(name, _STRING, array, compact, nullable=nullable,
                               items_nullable=items)
            elif kafka_type in ("bytes", "records"):
                field = _Field(name, _BYTES, array, flexible, nullable=nullable,
                               items_nullable=items)
            elif kafka_type in _FIXED:
                field = _Field(name, _FIXED_KIND, array, flexible, size=_FIXED[kafka_type],
                               nullable=nullable)
            else:
                raise TypeError(f"{name}: no layout for the Kafka type {kafka_type!r}")
        if tag is not None:
            tagged[int(tag)] = field
        elif fields and _plain_fixed(fields[-1]) and _plain_fixed(field):
            # a run of fixed-size fields is one step of the walk
            last = fields[-1]
            fields[-1] = _Field(f"{last.name.split('..')[0]}..{f.name}", _FIXED_KIND, False,
                                flexible, size=last.size + field.size)
        else:
            fields.append(field)
    least = sum(f.min_size() for f in fields) + (1 if flexible else 0)
    fixed = (fields[0].size if not flexible and len(fields) == 1 and _plain_fixed(fields[0])
             else None)
    return _Entity(cls.__name__, flexible, tuple(fields), tagged, least, fixed)


def _plain_fixed(field: _Field) -> bool:
    return field.kind == _FIXED_KIND and not field.array


def _optional(tp: Any) -> bool:
    """`tp` is `X | None`."""
    return typing.get_origin(tp) in (types.UnionType, typing.Union) and (
        type(None) in typing.get_args(tp))


def _strip_none(tp: Any) -> Any:
    """`X` of `X | None`; `tp` itself otherwise."""
    if _optional(tp):
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def check_request(frame: bytes | bytearray | memoryview, cls: type[Any]) -> None:
    """Check the request frame `frame` (without its size prefix) of kio's request class `cls`:
    header, then body. `FrameError` naming the field and byte when a count or length does not
    fit in the frame."""
    buf = memoryview(frame).cast("B")
    end = len(buf)
    pos = _entity(buf, 0, end, _compile(cls.__header_schema__, header=True))
    _entity(buf, pos, end, _compile(cls))
    # bytes after the last field are left unread, as Kafka's broker leaves them: librdkafka's
    # Metadata v13 for every topic carries three (docs/kafka-api.md, "Limits and security")


def _entity(buf: memoryview, pos: int, end: int, entity: _Entity) -> int:
    for field in entity.fields:
        pos = _field(buf, pos, end, field)
    if entity.flexible:
        pos = _tagged(buf, pos, end, entity)
    return pos


def _field(buf: memoryview, pos: int, end: int, field: _Field) -> int:
    if not field.array:
        return _value(buf, pos, end, field, field.nullable)
    at = pos
    if field.compact:
        count, pos = _uvarint(buf, pos, end, field.name)
        count -= 1  # 0: null
    else:
        count, pos = _int(buf, pos, end, 4, field.name)
    if count < -1:
        raise FrameError(f"{field.name}: an array count of {count} at byte {at}")
    if count == -1 and not field.nullable:
        raise FrameError(f"{field.name}: null at byte {at}, but the array is not nullable")
    if count <= 0:
        return pos
    least = max(1, field.min_value())
    if count * least > end - pos:
        raise FrameError(f"{field.name}: an array of {count} elements at byte {at} needs at "
                         f"least {count * least} bytes; {end - pos} are left")
    if field.kind == _FIXED_KIND:
        return pos + count * field.size
    if field.kind == _ENTITY and field.entity is not None and field.entity.fixed is not None:
        return pos + count * field.entity.fixed
    nullable = field.items_nullable
    for _ in range(count):
        pos = _value(buf, pos, end, field, nullable)
    return pos


def _value(buf: memoryview, pos: int, end: int, field: _Field, nullable: bool) -> int:
    kind = field.kind
    if kind == _FIXED_KIND:
        if field.size > end - pos:
            raise FrameError(f"{field.name}: {field.size} bytes at byte {pos}; "
                             f"{end - pos} are left")
        return pos + field.size
    if kind in (_STRING, _BYTES):
        at = pos
        if field.compact:
            length, pos = _uvarint(buf, pos, end, field.name)
            length -= 1  # 0: null
        else:
            length, pos = _int(buf, pos, end, 2 if kind == _STRING else 4, field.name)
        if length < -1:
            raise FrameError(f"{field.name}: a length of {length} at byte {at}")
        if length == -1 and not nullable:
            raise FrameError(f"{field.name}: null at byte {at}, but the field is not nullable")
        if length > end - pos:
            raise FrameError(f"{field.name}: a length of {length} at byte {at}; "
                             f"{end - pos} bytes are left")
        return pos + max(length, 0)
    entity = field.entity
    assert entity is not None  # noqa: S101 - set for entities by _compile
    if kind == _NULLABLE_ENTITY:
        marker, pos = _int(buf, pos, end, 1, field.name)
        if marker < 0:
            return pos
    return _entity(buf, pos, end, entity)


def _tagged(buf: memoryview, pos: int, end: int, entity: _Entity) -> int:
    at = pos
    name = f"{entity.name} tagged fields"
    count, pos = _uvarint(buf, pos, end, name)
    if count * 2 > end - pos:  # a tag and a size, one byte at least each
        raise FrameError(f"{name}: {count} tagged fields at byte {at}; {end - pos} bytes "
                         "are left")
    for _ in range(count):
        tag, pos = _uvarint(buf, pos, end, f"{name}, a tag number")
        size_at = pos
        size, pos = _uvarint(buf, pos, end, name)
        if size > end - pos:
            raise FrameError(f"{name}: tag {tag} of {size} bytes at byte {size_at}; "
                             f"{end - pos} are left")
        field = entity.tagged.get(tag)
        if field is not None:
            used = _field(buf, pos, pos + size, field)
            if used != pos + size:
                raise FrameError(f"{field.name}: tagged field of {size} bytes at byte "
                                 f"{size_at} holds {used - pos}")
        pos += size
    return pos


def _uvarint(buf: memoryview, pos: int, end: int, name: str) -> tuple[int, int]:
    value = 0
    for i in range(_MAX_VARINT):
        if pos + i >= end:
            raise FrameError(f"{name}: the frame ends inside a varint at byte {pos}")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, pos + i + 1
    raise FrameError(f"{name}: a varint longer than {_MAX_VARINT} bytes at byte {pos}")


def _int(buf: memoryview, pos: int, end: int, size: int, name: str) -> tuple[int, int]:
    if size > end - pos:
        raise FrameError(f"{name}: the frame ends at byte {end}, inside a {size}-byte length "
                         f"at byte {pos}")
    return int.from_bytes(buf[pos:pos + size], "big", signed=True), pos + size
