"""Taking every upload lease at start, on a store with S3's latency and no rate limit.

moto answers a few hundred requests a second, so on it the lease phase of
`benchmarks/partitions.py` measures moto. S3 answers each request in tens of milliseconds and
serves thousands at once, so there the phase is bound by latency over the acquisitions in
flight. This runs the real `LeaseKeeper` in-process over a file:// bucket whose every request
first waits `--latency-ms` (requests wait side by side, as S3's do), for each connection
pool size in `--pools`: the acquisitions in flight follow the pool (0.8 of it). The baseline
is the pool of 20, the default, which gives the 16 acquisitions in flight the keeper used
whatever the pool before. Each is a fresh bucket of new partitions (a head read that finds
nothing, then a blind lease create: two requests in series).

    python benchmarks/lease_start.py                      # 10,000 partitions, 25 ms, pools 20 80
    python benchmarks/lease_start.py --partitions 2000 --latency-ms 10
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import emit, progress, versions  # noqa: E402
from support.counting import CountingStore  # noqa: E402

from archiver.lease_keeper import LeaseKeeper, acquire_workers  # noqa: E402
from manifests.commit import ManifestStore  # noqa: E402
from manifests.lease_objects import PartitionId  # noqa: E402
from tiered.store import FileStore, StoreSettings  # noqa: E402
from tiered.store.base import ObjectStore  # noqa: E402


class LatentStore(CountingStore):
    """A real store whose every request takes at least `latency_s` more, counted."""

    def __init__(self, inner: ObjectStore, latency_s: float) -> None:
        super().__init__(inner)
        self.latency_s = latency_s

    def _count(self, operation: str, what: str) -> None:
        super()._count(operation, what)
        time.sleep(self.latency_s)


def one_pool(root: Path, pool: int, partitions: int, latency_s: float) -> dict[str, Any]:
    inner = FileStore(StoreSettings(url=(root / f"pool-{pool}").as_uri(),
                                    max_connections=pool))
    store = LatentStore(inner, latency_s)
    parts = {PartitionId("orders", p, "rev"): 1000 for p in range(partitions)}
    keeper = LeaseKeeper(store, ManifestStore(store), "n1", 30_000)
    keeper.publish(parts)
    start = time.monotonic()
    keeper.tick()
    seconds = time.monotonic() - start
    held = len(keeper.holdings())
    keeper.stop(release=False)
    requests = sum(store.take().values())
    store.close()
    return {"pool": pool, "in_flight": acquire_workers(pool), "seconds": round(seconds, 2),
            "leases_held": held, "requests": requests,
            "requests_per_s": round(requests / seconds, 1),
            "latency_bound_s": round(2 * partitions * latency_s / acquire_workers(pool), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--latency-ms", type=float, default=25.0)
    parser.add_argument("--pools", type=int, nargs="+", default=[20, 80])
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="tiered-lease-start-") as tmp:
        for pool in args.pools:
            progress(f"{args.partitions} partitions, pool {pool}")
            runs.append(one_pool(Path(tmp), pool, args.partitions, args.latency_ms / 1000))
    base = runs[0]["seconds"]
    for run in runs:
        run["speedup_vs_first_pool"] = round(base / run["seconds"], 2)
    emit({"benchmark": "lease_start", "versions": versions(), "partitions": args.partitions,
          "latency_ms": args.latency_ms, "runs": runs,
          "ok": all(r["leases_held"] == args.partitions for r in runs)})
    return 0 if all(r["leases_held"] == args.partitions for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
