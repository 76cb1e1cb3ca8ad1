"""Domain errors.

Every error a user can cause (bad config, corrupt file, unreachable bucket) is a `TieredError`
subclass with a message that names what is wrong and where; the CLI turns these into one line on
stderr and a non-zero exit code instead of a traceback.
"""

from __future__ import annotations


class TieredError(Exception):
    """Base of every error tiered raises on purpose."""

    #: process exit status the CLI uses for this error
    exit_code: int = 1


class ConfigError(TieredError):
    """A configuration file or value is malformed; the message names the key and the file."""

    exit_code = 2

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems: list[str] = problems if problems is not None else [message]


class CorruptSegmentError(TieredError):
    """Bytes of a segment, batch or index do not parse or fail their checksum.

    `path` is the file (or object key) the bytes came from, `position` the byte offset in it
    where the bad structure starts, so an operator can find it with `tiered log dump`.
    """

    exit_code = 3

    def __init__(
        self, reason: str, *, path: str | None = None, position: int | None = None
    ) -> None:
        self.reason = reason
        self.path = path
        self.position = position
        where = []
        if path is not None:
            where.append(str(path))
        if position is not None:
            where.append(f"byte {position}")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {reason}" if prefix else reason)

    def at(self, *, path: str | None = None, base_position: int = 0) -> CorruptSegmentError:
        """The same error re-anchored in a file: used when a buffer-level parse knows only
        positions relative to the buffer it was given."""
        pos = None if self.position is None else self.position + base_position
        return type(self)(self.reason, path=path or self.path, position=pos)


class OffsetOutOfRange(TieredError):
    """A requested offset is below the log start or past its end (Kafka's OFFSET_OUT_OF_RANGE)."""

    exit_code = 4
