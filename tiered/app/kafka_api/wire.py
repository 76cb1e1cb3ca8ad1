"""Kafka's framing: size-prefixed requests in, size-prefixed responses out, entities through kio.

    Request  => Size => Int32, RequestHeader (v1, or v2 with tagged fields for flexible
                versions: api_key Int16, api_version Int16, correlation_id Int32,
                client_id NullableString), then the request body
    Response => Size => Int32, ResponseHeader (v0: correlation_id; v1 adds tagged fields),
                then the response body

Every response is encoded by kio except Fetch's (`fetch_response`, by hand: it is on a
consumer's critical path), whose record bytes stay where they lie (chunk files of the read
cache, local segment reads) and go to the socket after the bytes encoded before them
(`Reply` holds both, in order).
"""

from __future__ import annotations

import io
import socket
import struct
from dataclasses import dataclass
from typing import Any

from kio.serial import entity_reader, entity_writer

from cache.fetched_bytes import Pieces
from tiered.app.kafka_api.frame_check import FrameError, check_request
from tiered.app.kafka_api.messages import request_class

__all__ = [
    "FRAME_SIZE",
    "MalformedRequest",
    "Reply",
    "Request",
    "encode_response",
    "parse_request",
    "peek_header",
]

FRAME_SIZE = struct.Struct(">i")
#: api_key, api_version, correlation_id: the start of every request header version
HEADER_PREFIX = struct.Struct(">hhi")
_INT32 = struct.Struct(">i")


class MalformedRequest(Exception):
    """A request that does not parse as the version it claims: the connection is closed."""


@dataclass(frozen=True)
class Request:
    """One parsed request: its header fields and the kio entity of its body."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any

    @property
    def flexible(self) -> bool:
        return bool(self.body.__flexible__)


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request frame, before choosing a parser."""
    if len(frame) < HEADER_PREFIX.size:
        raise MalformedRequest(f"a request of {len(frame)} bytes is too short for its header")
    key, version, correlation_id = HEADER_PREFIX.unpack_from(frame)
    return int(key), int(version), int(correlation_id)


def parse_request(frame: bytes) -> Request:
    """The request in `frame` (without its size prefix), whose api key and version the caller
    checked are served. `MalformedRequest` when it does not parse, or when a count or length
    in it cannot fit in the frame: checked before kio reads it, which would allocate what
    any count asks (frame_check)."""
    key, version, _ = peek_header(frame)
    cls = request_class(key, version)
    try:
        check_request(frame, cls)
    except FrameError as exc:
        raise MalformedRequest(f"{cls.__name__} v{version} does not parse: {exc}") from None
    try:
        header, used = entity_reader(cls.__header_schema__)(frame, 0)
        body, size = entity_reader(cls)(frame, used)
    except Exception as exc:  # kio's parse errors have no common base; any is a bad request
        raise MalformedRequest(f"{cls.__name__} v{version} does not parse: {exc}") from None
    # bytes after the last field stay unread, as Kafka's broker leaves them (librdkafka's
    # Metadata v13 for every topic carries three): the frame's size bounds them
    return Request(key, version, header.correlation_id, header.client_id, body)


def _encode(correlation_id: int, entity: Any) -> bytes:
    """Header and body of a response, without the size prefix."""
    buf = io.BytesIO()
    header_cls = entity.__header_schema__
    entity_writer(header_cls)(buf, header_cls(correlation_id=correlation_id))
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def encode_response(correlation_id: int, entity: Any) -> bytes:
    """A whole response frame, size prefix included."""
    body = _encode(correlation_id, entity)
    return FRAME_SIZE.pack(len(body)) + body


@dataclass
class Reply:
    """A response ready to send: bytes kio encoded and record pieces, in order. Owns the
    pieces' open files: `close()` after sending (or instead)."""

    parts: list[bytes | Pieces]

    @classmethod
    def of(cls, correlation_id: int, entity: Any) -> Reply:
        return cls([encode_response(correlation_id, entity)])

    @property
    def size(self) -> int:
        return sum(len(p) if isinstance(p, bytes) else p.size for p in self.parts)

    def send(self, sock: socket.socket) -> None:
        """Write the reply: each run of encoded bytes goes out with the record pieces after
        it, and the bytes after the last pieces with them (`Pieces.send`: one `sendmsg`
        where the socket allows)."""
        pending: list[bytes] = []
        for i, part in enumerate(self.parts):
            if not isinstance(part, Pieces):
                pending.append(part)
                continue
            rest = [p for p in self.parts[i + 1:] if isinstance(p, bytes)]
            if len(rest) == len(self.parts) - i - 1:  # the last pieces
                part.send(sock, head=b"".join(pending), tail=b"".join(rest))
                return
            part.send(sock, head=b"".join(pending))
            pending = []
        sock.sendall(b"".join(pending))

    def close(self) -> None:
        for part in self.parts:
            if isinstance(part, Pieces):
                part.close()
