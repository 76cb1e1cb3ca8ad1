"""Cluster mode at scale: `python benchmarks/cluster.py` (3 sidecars x 24 partitions).

Three `tiered run` processes beside three replicas of the same 24 partitions (the same batches,
different roll points), one `moto_server` bucket, the scenario of tests/cluster.py: two
sidecars start, a third joins, the busiest is killed -9 and restarted, another is paused
(SIGSTOP) mid-upload until its partitions are taken over. Reported, as one JSON object:

* upload amplification: bytes of segment objects sent / bytes of the log (what a replica
  holds), and bucket bytes / log bytes at the end; beside it, in the same run, the same log
  archived by three sidecars without leases (each uploading everything it holds);
* failover: kill -9 to every partition of the killed sidecar held by another, and to each of
  them uploaded again; the goal is within the lease time plus one upload interval (the upload
  loop's longest backoff, 10 s);
* lease requests per partition per minute: node records and lease objects, over the whole
  run and in a quiet window where nothing changes hands.
Exits 1 when a record was lost, an orphan left, or a goal missed.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import MotoServer, emit, progress, versions  # noqa: E402
from cluster import run_cluster, run_naive_baseline  # noqa: E402

from tiered.app.scheduler import UPLOAD_BACKOFF_MAX_S  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=24)
    parser.add_argument("--lease-ms", type=int, default=30_000,
                        help="cloud_storage_upload_lease_ms (default 30000, the default)")
    parser.add_argument("--steady-s", type=float, default=60.0,
                        help="quiet window for the steady-state lease request rate")
    parser.add_argument("--rate", type=float, default=10.0,
                        help="batches per second per partition the replicated log takes")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the run without leases")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    progress(f"cluster: seed {seed}, 3 sidecars x {args.partitions} partitions, lease "
             f"{args.lease_ms} ms")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with MotoServer() as moto, tempfile.TemporaryDirectory(prefix="tiered-cluster-") as work:
        moto.create_bucket("cluster")
        figures = run_cluster(Path(work), moto=moto.endpoint, bucket="cluster", seed=seed,
                              partitions=args.partitions, lease_ms=args.lease_ms,
                              grace_ms=5000, batches_per_s=args.rate, settle_s=5.0,
                              steady_s=args.steady_s, progress=progress)
        baseline = None
        if not args.no_baseline:
            moto.create_bucket("naive")
            progress("baseline: three sidecars without leases")
            baseline = run_naive_baseline(Path(work), moto=moto.endpoint, bucket="naive",
                                          seed=seed, partitions=args.partitions,
                                          seconds=min(figures.seconds, 60),
                                          batches_per_s=args.rate)
    goal_s = args.lease_ms / 1000 + UPLOAD_BACKOFF_MAX_S
    report = {
        "benchmark": "cluster",
        **figures.to_json(),
        "failover_goal_s": goal_s,
        "failover_within_goal": (figures.failover_upload_s is not None
                                 and figures.failover_upload_s <= goal_s),
        "amplification_within_goal": figures.bucket_amplification <= 1.1
        and figures.upload_amplification <= 1.1,
        "baseline_without_leases": baseline,
        "versions": versions("boto3", "moto"),
    }
    emit(report)
    ok = (not figures.problems and figures.lost == 0 and report["failover_within_goal"]
          and report["amplification_within_goal"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
