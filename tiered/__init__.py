"""tiered: a tiered-storage offload service for Kafka-format logs.

This package is the shared core and the service shell: configuration, the Kafka log format,
the local log reader and writer, object-store clients, the CLI and (later) the daemon.
"""

__version__ = "0.1.0"
