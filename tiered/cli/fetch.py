"""`tiered fetch`: read records of a partition by offset, from the local log or the bucket.

Exit status: 0 on success; 4 when the offset is out of range (also when the data is only in the
bucket and remote read is off); 7 for an unknown topic partition; 2 for a bad argument or
configuration; 3 when stored bytes fail their checksum; 5 / 6 for store / cache failures.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from cache.reader import DEFAULT_MAX_BYTES
from tiered.cli.options import config_option

log = logging.getLogger("tiered.fetch")



@click.command("fetch")
@config_option
@click.option("--topic", required=True, help="Topic name.")
@click.option("--partition", type=click.IntRange(min=0), required=True, help="Partition number.")
@click.option("--offset", type=click.IntRange(min=0), required=True,
              help="First offset wanted; the batch holding it comes first.")
@click.option("--max-bytes", type=click.IntRange(min=0), default=DEFAULT_MAX_BYTES,
              show_default=True,
              help="Byte budget; the first batch always comes whole, as in Kafka.")
@click.option("--format", "fmt", type=click.Choice(["raw", "jsonl"]), default="jsonl",
              show_default=True,
              help="raw: record-batch bytes to stdout as Kafka sends them; jsonl: one record "
                   "a line (offset, timestamp, key, value, headers; bytes as base64).")
def fetch_command(config_path: Path, topic: str, partition: int, offset: int, max_bytes: int,
                  fmt: str) -> None:
    """Fetch record batches of TOPIC/PARTITION starting at OFFSET.

    Served from the local log when it still holds the offset, otherwise from the bucket
    through the chunked read cache.
    """
    from cache.reader import Reader
    from tiered.app.http_api import FORMATS
    from tiered.config import load_config

    config = load_config(config_path)
    with Reader.from_config(config) as reader:
        result = reader.fetch(topic, partition, offset, max_bytes)
        body = FORMATS[fmt][1](result)
    out = sys.stdout.buffer
    out.write(body)
    out.flush()
    log.info("%s-%d: %d bytes from offset %d (%s); next offset %d", topic, partition,
             len(result.data), offset, result.source, result.next_offset)
