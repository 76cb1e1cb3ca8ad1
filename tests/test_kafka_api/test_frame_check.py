"""The frame checks in front of kio (tiered/app/kafka_api/frame_check.py), pure: every request
of every served API and version, written by kio's writer, passes and parses to what was
written; every count and length in it, made larger than the bytes left, is refused; the
attack frames are refused with a message naming the field and byte; and `parse_request`
refuses them before kio reads them (in a child process: kio aborts the process that reads
them)."""

from __future__ import annotations

import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.kafka_requests import METADATA_V1_ATTACK, METADATA_V12_ATTACK, encode, sample, served
from support.processes import child_env

from tiered.app.kafka_api import frame_check
from tiered.app.kafka_api.frame_check import FrameError, check_request
from tiered.app.kafka_api.messages import request_class
from tiered.app.kafka_api.ratelog import OncePerKey
from tiered.app.kafka_api.wire import parse_request

SERVED = [pytest.param(cls, id=f"{cls.__name__}-v{version}") for _k, version, cls in served()]



@pytest.mark.parametrize("cls", SERVED)
def test_every_served_request_passes_and_parses_as_written(cls: type[Any]) -> None:
    for entity in (sample(cls, full=True), sample(cls, full=True, width=3),
                   sample(cls, full=False)):
        for client_id in ("c", None, "x" * 300):
            frame = encode(entity, client_id=client_id)
            check_request(frame, cls)
            req = parse_request(frame)
            assert req.body == entity
            assert req.client_id == client_id


def _lengths(frame: bytes, cls: type[Any]) -> list[tuple[int, str]]:
    """Where the walk reads a count or length in `frame`: (byte, "varint" | "int16" |
    "int32"), without tag numbers and null markers of nullable entities."""
    seen: list[tuple[int, str]] = []
    varint, fixed = frame_check._uvarint, frame_check._int

    def traced_varint(buf: memoryview, pos: int, end: int, name: str) -> tuple[int, int]:
        if not name.endswith("a tag number"):
            seen.append((pos, "varint"))
        return varint(buf, pos, end, name)

    def traced_int(buf: memoryview, pos: int, end: int, size: int,
                   name: str) -> tuple[int, int]:
        if size > 1:
            seen.append((pos, f"int{8 * size}"))
        return fixed(buf, pos, end, size, name)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(frame_check, "_uvarint", traced_varint)
        mp.setattr(frame_check, "_int", traced_int)
        check_request(frame, cls)
    return seen


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint_width(frame: bytes, pos: int) -> int:
    width = 1
    while frame[pos + width - 1] & 0x80:
        width += 1
    return width


def _hostile(frame: bytes, pos: int, kind: str) -> Iterator[bytes]:
    """`frame` with the count or length at `pos` made the largest its encoding holds, and
    made one more than the bytes after it."""
    if kind == "varint":
        width = _varint_width(frame, pos)
        left = len(frame) - pos - width
        for value in (2**32 - 1, left + 2):  # compact: value - 1 elements or bytes
            yield frame[:pos] + _uvarint(value) + frame[pos + width:]
        return
    size = 2 if kind == "int16" else 4
    left = len(frame) - pos - size
    for value in (2 ** (8 * size - 1) - 1, left + 1):
        yield frame[:pos] + value.to_bytes(size, "big", signed=True) + frame[pos + size:]


@pytest.mark.parametrize("cls", SERVED)
def test_every_count_and_length_that_cannot_fit_is_refused(cls: type[Any]) -> None:
    frame = encode(sample(cls, full=True))
    lengths = _lengths(frame, cls)
    assert lengths, "the header has client_id's length at least"
    for pos, kind in lengths:
        for bad in _hostile(frame, pos, kind):
            with pytest.raises(FrameError):
                check_request(bad, cls)


def test_the_attack_frames_are_refused_naming_the_field() -> None:
    assert len(METADATA_V12_ATTACK) == 31
    with pytest.raises(FrameError, match=r"MetadataRequest\.topics: an array of 4294967294 "
                                         r"elements at byte 19 .* 3 are left"):
        check_request(METADATA_V12_ATTACK[4:], request_class(3, 12))
    with pytest.raises(FrameError, match=r"MetadataRequest\.topics: an array of 2147483647 "
                                         r"elements at byte 11 .* 0 are left"):
        check_request(METADATA_V1_ATTACK[4:], request_class(3, 1))


def _v12(body: bytes) -> bytes:
    """A Metadata v12 frame (no size prefix) of client "c" and `body`."""
    return struct.pack(">hhih", 3, 12, 1, 1) + b"c" + b"\x00" + body


@pytest.mark.parametrize(("frame", "cls", "message"), [
    # client_id's classic Int16 length in a flexible header
    (struct.pack(">hhih", 3, 12, 1, 32767) + b"c\x00\x01\x00\x00\x00", (3, 12),
     r"RequestHeader\.client_id: a length of 32767 at byte 8; 6 bytes are left"),
    # a topic entry needs 18 bytes at least (uuid, name, tags): 2 entries in 20 bytes do not
    (_v12(b"\x03" + bytes(20)), (3, 12), r"an array of 2 elements .* needs at least 36 bytes"),
    (_v12(b"\x01\x00\x00\xff\xff\xff\xff\x0f"), (3, 12),
     r"MetadataRequest tagged fields: 4294967295 tagged fields at byte 15; 0 bytes"),
    (_v12(b"\x01\x00\x00\x01\x07\xff\xff\xff\x7f"), (3, 12),
     r"tag 7 of 268435455 bytes at byte 17; 0 are left"),
    (_v12(b"\x81\x80\x80\x80\x80\x01"), (3, 12), r"a varint longer than 5 bytes at byte 12"),
    (_v12(b"\x81"), (3, 12), r"the frame ends inside a varint at byte 12"),
    (struct.pack(">hhih", 3, 1, 1, -2), (3, 1), r"client_id: a length of -2 at byte 8"),
    (struct.pack(">hhihsi", 3, 1, 1, 1, b"c", -3), (3, 1), r"an array count of -3 at byte 11"),
    # nulls where the schema has none: kio reads them, the handlers would meet a None
    (struct.pack(">hhihsii", 20, 1, 1, 1, b"c", -1, 0), (20, 1),
     r"DeleteTopicsRequest\.topic_names: null at byte 11, but the array is not nullable"),
    (struct.pack(">hhihshih", 12, 0, 1, 1, b"c", -1, 5, 0), (12, 0),
     r"HeartbeatRequest\.group_id: null at byte 11, but the field is not nullable"),
])
def test_bad_counts_and_lengths_name_field_and_byte(frame: bytes, cls: tuple[int, int],
                                                     message: str) -> None:
    with pytest.raises(FrameError, match=message):
        check_request(frame, request_class(*cls))


def test_fixed_size_elements_bound_the_count_by_their_size() -> None:
    """OffsetFetch v1's partition indexes are Int32s: 3 of them do not fit in 8 bytes."""
    cls = request_class(9, 1)
    head = struct.pack(">hhih", 9, 1, 1, 1) + b"c" + struct.pack(">h", 1) + b"g"
    topic = struct.pack(">ih", 1, 1) + b"t"
    ok = head + topic + struct.pack(">i", 2) + bytes(8)
    check_request(ok, cls)
    with pytest.raises(FrameError, match=r"an array of 3 elements .* needs at least 12 bytes; "
                                         r"8 are left"):
        check_request(head + topic + struct.pack(">i", 3) + bytes(8), cls)


#: the address space of the child that parses an attack: kio asks for 16 GiB for a classic
#: count of 2^31-1, which an unlimited process may be granted (and never touch)
CHILD_ADDRESS_SPACE = 4 << 30


def _in_child(frame: bytes) -> subprocess.CompletedProcess[str]:
    code = ("import resource\n"
            f"resource.setrlimit(resource.RLIMIT_AS, ({CHILD_ADDRESS_SPACE}, "
            f"{CHILD_ADDRESS_SPACE}))\n"
            "from tiered.app.kafka_api.wire import MalformedRequest, parse_request\n"
            "try:\n"
            f"    parse_request({frame!r})\n"
            "except MalformedRequest as exc:\n"
            "    print(exc)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=child_env(), timeout=120, check=False)


@pytest.mark.parametrize("frame", [METADATA_V12_ATTACK, METADATA_V1_ATTACK])
def test_parse_request_refuses_the_attacks_before_kio_reads_them(frame: bytes) -> None:
    got = _in_child(frame[4:])
    # before the checks kio aborted the process (exit 134) or raised MemoryError
    assert got.returncode == 0, got.stderr[-2000:]
    assert "MetadataRequest" in got.stdout and "does not parse" in got.stdout, got.stdout


def test_once_per_key_logs_the_first_of_each_interval_and_counts_the_rest() -> None:
    now = [100.0]
    clock: Callable[[], float] = lambda: now[0]  # noqa: E731
    once = OncePerKey(60.0, clock=clock, max_keys=2)
    assert once.admit("10.0.0.1") == 0
    assert once.admit("10.0.0.1") is None
    assert once.admit("10.0.0.2") == 0  # another client has its own minute
    now[0] += 59.9
    assert once.admit("10.0.0.1") is None
    now[0] += 0.1
    assert once.admit("10.0.0.1") == 2  # two held back since the last line
    assert once.admit("10.0.0.1") is None
    # a third key evicts the one logged longest ago (10.0.0.2): memory stays bounded
    assert once.admit("10.0.0.3") == 0
    assert once.admit("10.0.0.2") == 0  # forgotten, so logged again
    assert once.admit("10.0.0.3") is None


def test_bytes_after_the_last_field_are_left_unread_as_kafka_does() -> None:
    """librdkafka's Metadata v13 for every topic carries three bytes past its last field; a
    broker leaves them unread, and so does the check (the frame's size still bounds them)."""
    check_request(_v12(b"\x01\x00\x00\x00\x00\x00\x00"), request_class(3, 12))
