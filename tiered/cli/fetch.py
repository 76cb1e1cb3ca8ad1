"""`tiered fetch`: read records of a partition by offset, from the local log or the bucket.

Exit status: 0 on success; 4 when the offset is out of range (also when the data is only in the
bucket and remote read is off); 7 for an unknown topic partition; 2 for a bad argument or
configuration; 3 when stored bytes fail their checksum; 5 / 6 for store / cache failures.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cache.reader import DEFAULT_MAX_BYTES
from tiered.cli.options import config_option
from tiered.config.units import UnitError, parse_timestamp_ms
from tiered.errors import OffsetOutOfRange, TieredError

if TYPE_CHECKING:
    from cache.reader import Reader

log = logging.getLogger("tiered.fetch")


@click.command("fetch")
@config_option
@click.option("--topic", required=True, help="Topic name.")
@click.option("--partition", type=click.IntRange(min=0), required=True, help="Partition number.")
@click.option("--offset", type=click.IntRange(min=0), default=None,
              help="First offset wanted; the batch holding it comes first.")
@click.option("--timestamp", "timestamp", default=None, metavar="MS|ISO-8601",
              help="Instead of --offset: start at the first record whose timestamp is at or "
                   "after this time (ms since the epoch, or e.g. 2026-11-01T00:00:00Z), "
                   "looked up in the local log or the bucket as Kafka's ListOffsets does.")
@click.option("--max-bytes", type=click.IntRange(min=0), default=DEFAULT_MAX_BYTES,
              show_default=True,
              help="Byte budget; the first batch always comes whole, as in Kafka.")
@click.option("--format", "fmt", type=click.Choice(["raw", "jsonl"]), default="jsonl",
              show_default=True,
              help="raw: record-batch bytes to stdout as Kafka sends them; jsonl: one record "
                   "a line (offset, timestamp, key, value, headers; bytes as base64).")
def fetch_command(config_path: Path, topic: str, partition: int, offset: int | None,
                  timestamp: str | None, max_bytes: int, fmt: str) -> None:
    """Fetch record batches of TOPIC/PARTITION starting at OFFSET (or at TIMESTAMP).

    Served from the local log when it still holds the offset, otherwise from the bucket
    through the chunked read cache.
    """
    from cache.reader import Reader
    from tiered.app.http_api import FORMATS, offset_at
    from tiered.config import load_config

    if (offset is None) == (timestamp is None):
        raise click.UsageError("give exactly one of --offset and --timestamp")
    wanted_ms = None
    if timestamp is not None:
        try:
            wanted_ms = parse_timestamp_ms(timestamp)
        except UnitError as exc:
            raise click.BadParameter(str(exc), param_hint="--timestamp") from None
    config = load_config(config_path)
    with Reader.from_config(config) as reader:
        if wanted_ms is not None:
            offset = offset_at(reader, topic, partition, wanted_ms)
            log.info("%s-%d: the first record at or after %d ms is offset %d", topic,
                     partition, wanted_ms, offset)
        assert offset is not None
        try:
            result = reader.fetch(topic, partition, offset, max_bytes)
        except OffsetOutOfRange as exc:
            raise OffsetOutOfRange(_out_of_range(reader, topic, partition, offset, exc)) from None
        body = FORMATS[fmt][1](result)
    out = sys.stdout.buffer
    out.write(body)
    out.flush()
    log.info("%s-%d: %d bytes from offset %d (%s); next offset %d", topic, partition,
             len(result.data), offset, result.source, result.next_offset)


def _out_of_range(reader: Reader, topic: str, partition: int, offset: int,
                  exc: OffsetOutOfRange) -> str:
    """The error with the whole readable range, local log and bucket, as the HTTP API's 416
    names it: the fetch path may not have read the head (a daemon's consumer polling at the
    end must stay cheap), but a person running one command wants the real bounds."""
    try:
        start = reader.earliest_offset(topic, partition)
        end = reader.latest_offset(topic, partition)
    except TieredError:
        return str(exc)  # the bounds could not be read: the fetch's own words
    if start <= offset < end:
        return str(exc)  # in range but not readable (remote read off): the fetch says why
    if end <= start:
        return f"{topic}-{partition}: offset {offset} is not readable: the log is empty " \
               f"(its end is {end})"
    return (f"{topic}-{partition}: offset {offset} is outside the readable offsets "
            f"{start}..{end - 1} (the log end is {end})")
