"""Write the demo's sample topic into a Kafka log directory, for the MinIO dev stack.

    python examples/seed_log.py /var/lib/kafka/data [NODE_ID]

Run it again to append more; the daemon picks up what closes. docker-compose.yml runs this
once before it starts the daemon. Like a KRaft broker's log dir it gets a `meta.properties`
naming its node (NODE_ID, default 1; an existing file is kept), so the sidecar is named after
that broker rather than after the host.
"""

from __future__ import annotations

import sys
import tempfile
import uuid
from pathlib import Path

from tiered.app.demo import DEMO_TOPIC, demo_config, write_sample_topic


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or (len(argv) == 2 and not argv[1].isdigit()):
        print(__doc__, file=sys.stderr)
        return 2
    log_dir = Path(argv[0])
    log_dir.mkdir(parents=True, exist_ok=True)
    meta = log_dir / "meta.properties"
    if not meta.exists():  # a broker's own file wins
        node_id = argv[1] if len(argv) == 2 else "1"
        meta.write_text(f"version=1\nnode.id={node_id}\ncluster.id={uuid.uuid4()}\n")
    with tempfile.TemporaryDirectory() as scratch:  # only the topic settings are used
        config = demo_config(Path(scratch))
        records, size, rolled, _ = write_sample_topic(config, log_dir)
    print(f"wrote {records} records ({size} bytes, {rolled} segments) of {DEMO_TOPIC!r} "
          f"to {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
