"""The read-only Kafka protocol endpoint of `tiered run` (docs/kafka-api.md): Kafka clients
consume every partition the sidecar can read, local log first, then the bucket.

    server.py       listening socket, connection threads, TLS, limits
    wire.py         framing, kio encoding, Fetch answers spliced with the record bytes
    apis.py         the APIs and versions served; ApiVersions
    metadata.py     Metadata, FindCoordinator, ListOffsets
    fetch.py        Fetch (long polls, byte budgets, read_committed)
    groups.py       JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
                    DescribeGroups, ListGroups, DeleteGroups, OffsetDelete, offsets retention
    coordinator.py  the consumer-group state machine (pure)
    catalog.py      which topics, partitions and topic ids are served
    readonly.py     every write API, answered with the read-only error
"""

from tiered.app.kafka_api.server import KafkaServer, KafkaStats

__all__ = ["KafkaServer", "KafkaStats"]
