"""Fetching one chunk: a ranged GET through the injected fetcher, checked before anything keeps
it. A short or corrupt download is discarded and fetched again, a bounded number of times; a
fetcher failure is reported at once (the store client has already retried) as
ChunkDownloadError with the cause chained."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

from cache.errors import ChunkDownloadError
from tiered.errors import CorruptSegmentError, TieredError
from tiered.kafka.records import Buffer

__all__ = ["STREAM_PIECE", "ByteStream", "Fetcher", "Streamer", "Verifier", "fetch_verified"]

#: fetch(object key, begin_inclusive, end_exclusive) -> exactly those bytes
Fetcher = Callable[[str, int, int], bytes]
class ByteStream(Protocol):
    """Bytes as they arrive: `read(n)` gives up to `n` (b"" at the end), `readinto(b)` puts up
    to `len(b)` into `b` and says how many (0 at the end); `close()` ends it."""

    def read(self, n: int = -1, /) -> bytes: ...

    def readinto(self, b: memoryview, /) -> int: ...

    def close(self) -> None: ...


class Streamer(Protocol):
    """stream(object key, begin_inclusive, end_exclusive) -> those bytes as one streamed
    request; `to_end`: `end` is the object's size (a backend may then send no range)."""

    def __call__(self, key: str, begin: int, end: int, /, *, to_end: bool = False
                 ) -> ByteStream: ...


#: verify(chunk bytes, position of its first byte in the segment); raises CorruptSegmentError.
#: A streamed chunk that is not the whole segment is verified a run of whole batches at a time
Verifier = Callable[[Buffer, int], None]


class _BadDownload(Exception):
    """A downloaded chunk is short or fails verification: discard it and fetch again."""

    def __init__(self, reason: str, position: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        #: where in the object the damage starts, when the check knows
        self.position = position


def fetch_verified(
    fetch: Fetcher,
    key: str,
    begin: int,
    end: int,
    verify: Verifier | None,
    *,
    attempts: int,
    on_bytes: Callable[[int], None],
) -> bytes:
    """Bytes [begin, end) of object `key`, of the right length and passing `verify`. Every
    byte fetched, good or not, is reported to `on_bytes` (for the bytes-downloaded metric).
    CorruptSegmentError when `attempts` downloads in a row were bad."""

    def attempt() -> bytes:
        try:
            data = fetch(key, begin, end)
        except TieredError as err:
            raise ChunkDownloadError(
                f"downloading bytes [{begin}, {end}) of {key} failed: {err}"
            ) from err
        except Exception as err:  # a custom fetcher's own exception: name it, chain it
            raise ChunkDownloadError(
                f"downloading bytes [{begin}, {end}) of {key} failed: "
                f"{type(err).__name__}: {err}"
            ) from err
        on_bytes(len(data))
        if len(data) != end - begin:
            raise _BadDownload(f"got {len(data)} bytes, asked for {end - begin}")
        if verify is not None:
            try:
                verify(data, begin)
            except CorruptSegmentError as err:
                raise _BadDownload(err.reason, err.position) from err
        return data

    try:
        result: bytes = Retrying(
            stop=stop_after_attempt(attempts),
            retry=retry_if_exception_type(_BadDownload),
            reraise=True,
        )(attempt)
    except _BadDownload as bad:
        raise CorruptSegmentError(
            f"chunk failed verification in {attempts} downloads: {bad.reason}",
            path=key, position=begin if bad.position is None else bad.position,
        ) from bad
    return result


#: bytes asked of a stream per read: small enough that the allocator reuses the pieces' memory
STREAM_PIECE = 1 << 20
