"""The multi-writer chaos run for as long as you like: `python benchmarks/soak.py --minutes 10`.

Two `tiered run` daemons on one log dir and bucket (one killed -9 every few seconds, the other
now and then), `archive --once` and `merge` beside them, random S3 faults in front of a
`moto_server` child process, a broker stand-in appending live; then every record is read back
through `tiered fetch`, every object every manifest names is checked, and `tiered scrub` runs
(tests/chaos.py has the scenario). Prints one JSON object: cycles, kills, faults by kind,
records verified, lost, dangling manifest entries. Exits 1 when anything was lost.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import MotoServer, emit, versions  # noqa: E402
from chaos import run_chaos  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0,
                        help="how long the writers run before the final check (default 10)")
    parser.add_argument("--seed", type=int, default=None,
                        help="replay a run (default: a random seed, printed)")
    parser.add_argument("--fault-rate", type=float, default=0.03,
                        help="share of S3 requests that fail (default 0.03)")
    parser.add_argument("--grace-ms", type=int, default=1500,
                        help="cloud_storage_gc_grace_period_ms of the daemons (default 1500)")
    parser.add_argument("--merges", type=int, default=None,
                        help="merge jobs during the run (default: one per 2 minutes, at least 2)")
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error("--minutes must be positive")
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"soak: seed {seed}, {args.minutes:g} minute(s)", file=sys.stderr, flush=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    merges = args.merges if args.merges is not None else max(2, int(args.minutes / 2))
    with MotoServer() as moto, tempfile.TemporaryDirectory(prefix="tiered-soak-") as work:
        bucket = f"soak-{seed}"
        moto.create_bucket(bucket)
        figures = run_chaos(Path(work), seed=seed, seconds=args.minutes * 60,
                            endpoint=moto.endpoint, bucket=bucket, merges=merges,
                            fault_rate=args.fault_rate, grace_ms=args.grace_ms,
                            progress=lambda line: print(line, file=sys.stderr, flush=True))
    report = {"benchmark": "soak", **figures.to_json(),
              "versions": versions("boto3", "moto", "pyspark")}
    emit(report)
    return 0 if figures.lost == 0 and figures.dangling == 0 and not figures.problems else 1


if __name__ == "__main__":
    sys.exit(main())
