"""tiered: a tiered-storage offload service for Kafka-format logs.

This package is the shared core and the service shell: configuration, the Kafka log format,
the local log reader and writer, object-store clients (`tiered.store`), the application
(`tiered.app`: the daemon, its HTTP and Kafka endpoints, `describe-storage`, the demo) and the
CLI (`tiered.cli`). The write path, the read cache, the manifests and the Spark jobs are the
sibling packages `archiver`, `cache`, `manifests` and `spark_jobs` (docs/design.md).
"""

__version__ = "0.1.0"
