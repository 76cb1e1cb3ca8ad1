"""What every request handler of the Kafka endpoint gets: the services shared by all
connections, the state of its own connection, and the mapping from tiered's errors to Kafka's
error codes (docs/kafka-api.md, "Error codes")."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from cache.reader import InvalidRequest, UnknownPartition
from tiered.app.kafka_api.auth import ConnectionAuth, Guard
from tiered.errors import CorruptSegmentError, OffsetOutOfRange, TieredError

if TYPE_CHECKING:
    from cache.reader import Reader
    from tiered.app.kafka_api.catalog import Catalog
    from tiered.app.kafka_api.groups import GroupCoordinator

__all__ = ["Connection", "FetchLimits", "Node", "READ_ONLY", "Services", "error_code_of"]

log = logging.getLogger("tiered.app.kafka_api")

#: what a refused write says wherever the response has room for a message
READ_ONLY = ("tiered's Kafka endpoint is read-only: it serves the history in the log dirs and "
             "the bucket, and accepts no writes")


@dataclass(frozen=True)
class Node:
    """This endpoint as clients see it: it leads every partition it serves."""

    node_id: int
    host: str
    port: int


@dataclass(frozen=True)
class FetchLimits:
    """What one Fetch may cost (docs/kafka-api.md, "Limits and security")."""

    #: record bytes in one answer (`[kafka] fetch_max_bytes`)
    max_bytes: int = 57_671_680
    #: distinct partitions read by one request (`[kafka] max_partitions_per_fetch`)
    max_partitions: int = 1000
    #: chunk files of the read cache one answer holds open until it is sent
    max_chunk_files: int = 128


@dataclass
class Services:
    """Shared by every connection's thread; each part is thread-safe."""

    reader: Reader
    catalog: Catalog
    groups: GroupCoordinator
    node: Node
    cluster_id: str
    #: set when the server stops: long polls and group waits end early
    stopping: threading.Event = field(default_factory=threading.Event)
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    fetch_limits: FetchLimits = field(default_factory=FetchLimits)
    #: authentication and ACLs (docs/security.md); open when security is not configured
    guard: Guard = field(default_factory=Guard.open)


@dataclass
class Connection:
    """One client connection: served by its own thread, so no locking."""

    conn_id: int
    peer_host: str
    #: consumer sessions of the read cache this connection opened (closed with it)
    sessions: set[Hashable] = field(default_factory=set)
    #: where the next Fetch naming more partitions than it may read starts reading them
    fetch_cursor: int = 0
    #: who the client is and its SASL state (docs/security.md)
    auth: ConnectionAuth = field(default_factory=ConnectionAuth)

    def session(self, topic: str, partition: int) -> Hashable:
        """The read-cache session of this connection's reads of one partition: a Kafka
        consumer fetches each partition sequentially on its connection."""
        key = ("kafka", self.conn_id, topic, partition)
        self.sessions.add(key)
        return key


def error_code_of(exc: TieredError, what: str) -> ErrorCode:
    """Kafka's code for a read that failed with `exc`; logs the failures an operator should
    see (`what` names the partition)."""
    if isinstance(exc, UnknownPartition):
        return ErrorCode.unknown_topic_or_partition
    if isinstance(exc, OffsetOutOfRange):
        return ErrorCode.offset_out_of_range
    if isinstance(exc, CorruptSegmentError):
        log.error("%s: refusing corrupt data: %s", what, exc)
        return ErrorCode.corrupt_message
    if isinstance(exc, InvalidRequest):
        return ErrorCode.invalid_request
    log.warning("%s: read failed: %s", what, exc)
    return ErrorCode.kafka_storage_error
