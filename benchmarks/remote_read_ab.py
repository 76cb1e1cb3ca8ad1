"""Two versions of the daemon side by side on the single-segment figure
(`python benchmarks/remote_read.py ab --a TREE --b TREE`).

Why: on a shared 2-core machine one consumer's rate over one segment moves by 10-15% from run
to run, so a change worth 5% cannot be told from the noise by running `remote_read.py http`
once per version. Here two `tiered run` processes, each importing the code of its own source
tree (`--a`, `--b`: a checkout's root, this one by default), serve one bucket on one
moto_server, each with its own cache directory on tmpfs. Single-segment consumer runs alternate
between them A B B A A B ... (each on a segment of its own, followed by one nobody reads, as in
`remote_read.py http`), each after both daemons are idle and right after a boto3 streamed GET
of the same object: a slow period of the host hits both sides.

Reported (JSON): each side's median MB/s, ratio to its boto3 GET and daemon CPU per segment;
over the pairs of neighbouring runs, the median difference B - A (MB/s and ratio) and how many
pairs B won. Run it with both sides on the same tree first: the difference it reports then is
the harness's own (the second daemon's slot read a few MB/s slower here).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from _common import MB, SHM, DaemonProcess, MotoServer, at_least, progress, versions
from remote_read_http import BUCKET, Run


def _tree(parser: argparse.ArgumentParser, text: str) -> Path:
    tree = Path(text).resolve()
    if not (tree / "tiered" / "__init__.py").is_file():
        parser.error(f"{text} is not a tiered source tree (no tiered/__init__.py in it)")
    return tree


def run_ab(argv: list[str]) -> dict[str, Any]:
    here = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(prog="remote_read.py ab", description=__doc__)
    parser.add_argument("--a", default=str(here), help="source tree of daemon A (a checkout)")
    parser.add_argument("--b", default=str(here), help="source tree of daemon B (a checkout)")
    parser.add_argument("--pairs", type=at_least(1), default=8, help="runs per side")
    parser.add_argument("--segment-mb", type=at_least(1), default=62)
    parser.add_argument("--chunk-mb", type=at_least(1), default=16)
    parser.add_argument("--prefetch", type=at_least(0), default=None,
                        help="cloud_storage_chunk_prefetch; not given: left out (adaptive)")
    args = parser.parse_args(argv)
    trees = {"a": _tree(parser, args.a), "b": _tree(parser, args.b)}
    # what remote_read_http's Run expects; the big active segment and trials are not used
    setup = argparse.Namespace(segment_mb=args.segment_mb, segments=4 * args.pairs + 3,
                               chunk_mb=args.chunk_mb, prefetch=args.prefetch,
                               big_active_mb=1, trials=1, seed=1, cache_on_disk=False)
    work = Path(tempfile.mkdtemp(prefix="tiered-remote-read-ab-",
                                 dir=SHM if Path(SHM).is_dir() else None))
    cache_b = work / "cache-b"
    report: dict[str, Any] = {"benchmark": "remote_read ab", "segment_bytes":
                              args.segment_mb * 1024 * 1024, "pairs": args.pairs,
                              "trees": {k: str(v) for k, v in trees.items()}}
    try:
        with MotoServer() as moto:
            moto.create_bucket(BUCKET)
            run = Run(setup, work, moto)
            run.prepare()
            text = (work / "tiered.toml").read_text()
            (work / "b.toml").write_text(text.replace(str(run.cache_dir), str(cache_b)))
            daemons = {"a": DaemonProcess(work / "tiered.toml", work / "a.log",
                                          tree=trees["a"])}
            try:
                daemons["b"] = DaemonProcess(work / "b.toml", work / "b.log", tree=trees["b"])
                report |= _alternate(run, daemons, 2 * args.pairs)
            finally:
                for daemon in daemons.values():
                    daemon.stop()
            shutil.rmtree(run.cache_dir, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["versions"] = versions("boto3", "moto")
    return report


def _alternate(run: Run, daemons: dict[str, DaemonProcess], runs: int) -> dict[str, Any]:
    """`runs` single-segment runs, A B B A A B ...; the report's figures."""
    rows: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    for i in range(runs):
        side = "a" if i % 4 in (0, 3) else "b"
        segment = 2 + 2 * i
        progress(f"run {i + 1} of {runs}: daemon {side.upper()}")
        for daemon in daemons.values():
            daemon.settle()
        total, took = run.boto3_stream(segment)
        space = run.space_for([segment])
        daemon = daemons[side]
        cpu = daemon.cpu_s()
        mine, mine_s, pieces = run.read_segments(daemon.port, f"ab{segment}", [segment], space)
        cpu = daemon.cpu_s() - cpu
        run.check_segments(segment, pieces)
        rate, base = mine / mine_s / MB, total / took / MB
        rows[side].append({"tiered_mb_per_s": round(rate, 1),
                           "boto3_streamed_get_mb_per_s": round(base, 1),
                           "ratio": round(rate / base, 3),
                           "daemon_cpu_ms": round(cpu * 1000)})
    out: dict[str, Any] = {}
    for side, got in rows.items():
        out[side] = {key: round(statistics.median(r[key] for r in got), 3) for key in got[0]
                     } | {"runs": got}
    pairs = list(zip(rows["a"], rows["b"], strict=True))
    out["b_minus_a"] = {
        "tiered_mb_per_s": round(statistics.median(
            b["tiered_mb_per_s"] - a["tiered_mb_per_s"] for a, b in pairs), 1),
        "ratio": round(statistics.median(b["ratio"] - a["ratio"] for a, b in pairs), 3),
        "b_won": sum(b["tiered_mb_per_s"] > a["tiered_mb_per_s"] for a, b in pairs),
    }
    return out
