"""Write the demo's sample topic into a Kafka log directory, for the MinIO dev stack.

    python examples/seed_log.py /var/lib/kafka/data

Run it again to append more; the daemon picks up what closes. docker-compose.yml runs this
once before it starts the daemon.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tiered.app.demo import DEMO_TOPIC, demo_config, write_sample_topic


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    log_dir = Path(argv[0])
    log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:  # only the topic settings are used
        config = demo_config(Path(scratch))
        records, size, rolled, _ = write_sample_topic(config, log_dir)
    print(f"wrote {records} records ({size} bytes, {rolled} segments) of {DEMO_TOPIC!r} "
          f"to {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
