"""Upload throughput: `tiered archive --once` against raw boto3 and `aws s3 cp --recursive`,
the same segment files, the same concurrency, the same moto server, in one run.

Writes a topic of about `--size-mb` MiB (`--partitions` partitions, segments of
`--segment-mb` MiB, incompressible records) with tiered's LogWriter, reads it once so every
contender finds it in the page cache, starts `moto_server` on a free 127.0.0.1 port, then runs
each contender into a fresh bucket of its own and counts what landed there:

    tiered_cli          `tiered archive --once --config cfg.toml --json` (this interpreter's
                        entry point), a child process (interpreter start, scan, uploads,
                        manifest commits): the headline
    tiered_inprocess    `Archiver(config, store).run_once()` in this process, then further
                        upload rounds while they make progress (as the daemon runs them); the
                        figure leaves out interpreter start-up and imports
    boto3               `client.upload_file` for every `.log`, a ThreadPoolExecutor of the
                        concurrency tiered has at maximum shares, each file's parts in sequence
                        (`use_threads=False`): at most that many requests in flight, as tiered
    boto3_parallel_parts  the same executor, but boto3's default of parallel multipart parts
                        (`--part-concurrency` threads per file): what tiered could gain from
                        uploading the parts of one big segment at once
    aws_cli             `aws s3 cp --recursive` of the same `.log` files (hard links), with
                        `max_concurrent_requests` set to the same concurrency

Throughput is segment (`.log`) bytes over wall time, in MB/s (10**6 bytes); the ratio that
counts is `ratios.tiered_cli_vs_boto3` (goal: at least 0.9), from each contender's median
run; `ratios_paired_by_round` is the median of the per-round ratios instead (the contenders
of a round run back to back, so a slow spell of a shared machine hits both alike). tiered
also uploads index objects per segment and its manifests, counted in `objects` /
`bucket_bytes` but not in MB/s.

The aws CLI pins its own botocore, so it never goes into the project's environment: when
`aws` is not on PATH it is pip-installed into a private venv under `benchmarks/.cache/awscli`;
if that fails the contender is reported as skipped with the reason.

    python benchmarks/upload.py                       # 1 GiB, 128 MiB segments
    python benchmarks/upload.py --size-mb 256 --segment-mb 32
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import venv
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    MIB,
    MotoServer,
    Stopwatch,
    bucket_contents,
    daemon_config,
    emit,
    fake_aws_env,
    mb_per_s,
    progress,
    read_through,
    versions,
    write_sample_log,
)

REPO = Path(__file__).resolve().parent.parent
AWSCLI_VENV = Path(__file__).resolve().parent / ".cache" / "awscli"
TOPIC = "bench"
#: this interpreter's `tiered` entry point. Not `-m tiered.cli.main`: run as __main__, that module
#: is a second copy of tiered.cli.main; tiered.cli.commands registers its commands on the real one
#: (archive among them) are missing from it. -P: a `manifests/` or `tiered/` directory in the
#: current directory must not shadow the packages
TIERED_CLI = [sys.executable, "-P", "-c", "import sys; from tiered.cli.main import main; "
              "sys.argv[0] = 'tiered'; main()"]
#: bytes uploaded, untimed, before the first contender
WARM_UP_BYTES = 128 * MIB


@dataclass
class Run:
    """What every contender gets: the files, the server, the shared settings."""

    workdir: Path
    log_dir: Path
    files: list[Path]
    segment_bytes: int
    moto: MotoServer
    concurrency: int
    shares: int
    multipart_threshold: int
    multipart_chunksize: int
    part_concurrency: int
    cli_timeout_s: float
    install_aws_cli: bool


# --- tiered ----------------------------------------------------------------------------------


def write_config(workdir: Path, log_dir: Path, endpoint: str, bucket: str,
                 shares: int | None) -> Path:
    """A config for the sample log and `bucket`. Local retention stays `advise`, so every
    contender finds the same files. With `shares` the controller is pinned there (min = max):
    the pass then runs with the full upload budget that the baselines get."""
    path = workdir / f"{bucket}.toml"
    pinned = "" if shares is None else (
        f"cloud_storage_upload_ctrl_min_shares = {shares}\n"
        f"cloud_storage_upload_ctrl_max_shares = {shares}\n"
    )
    path.write_text(daemon_config(bucket=bucket, endpoint=endpoint, log_dir=log_dir,
                                  cache_dir=workdir / "cache", cluster=pinned),
                    encoding="utf-8")
    return path


@dataclass(frozen=True)
class TieredLimits:
    """tiered's upload budget at maximum shares and its multipart settings, from its config."""

    max_shares: int
    concurrency: int
    bandwidth_bytes_per_s: int | None
    multipart_threshold: int
    multipart_chunksize: int


def tiered_limits(config_path: Path) -> TieredLimits:
    """Asked of an `Archiver` built from the config with its shares at the maximum, so that
    "same concurrency" holds by construction rather than by a copied constant."""
    from archiver.controller import ControllerParams
    from archiver.service import Archiver
    from tiered.config import load_config
    from tiered.store import open_store

    config = load_config(config_path)
    max_shares = ControllerParams.from_cluster(config.cluster).max_shares
    settings = config.store_settings()
    archiver = Archiver(config, open_store(settings), fixed_shares=max_shares)
    try:
        archiver.update_controller()
        budget = archiver.budget
    finally:
        archiver.close()
    return TieredLimits(max_shares, budget.concurrency, budget.bandwidth_bytes_per_s,
                        settings.multipart_threshold, settings.multipart_chunksize)


def _config_for(run: Run, bucket: str) -> Path:
    return write_config(run.workdir, run.log_dir, run.moto.endpoint, bucket, run.shares)


def run_tiered_cli(run: Run, bucket: str) -> dict[str, Any]:
    config = _config_for(run, bucket)
    env = fake_aws_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [*TIERED_CLI, "-q", "archive", "--once", "--config", str(config), "--json"]
    with Stopwatch() as sw:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=run.cli_timeout_s, check=False)
    out: dict[str, Any] = {"seconds": round(sw.seconds, 3),
                           "cpu_seconds": round(sw.cpu_seconds, 2), "exit_code": proc.returncode}
    if proc.returncode != 0:
        out["error"] = (proc.stderr.strip() or proc.stdout.strip())[-1000:]
    return out


def run_tiered_inprocess(run: Run, bucket: str) -> dict[str, Any]:
    """`run_once`, then more upload rounds while they make progress, as the daemon does
    (a round takes a bounded number of segments per partition)."""
    from archiver.service import Archiver
    from tiered.config import load_config
    from tiered.store import open_store

    config = load_config(_config_for(run, bucket))
    store = open_store(config.store_settings())
    problems: list[str] = []
    with Stopwatch() as sw:
        archiver = Archiver(config, store)
        try:
            report = archiver.run_once()
            rounds, uploaded = 1, sum(p.uploaded_segments for p in report.partitions)
            problems.extend(report.errors)
            while report.ok and any(p.uploaded_segments for p in report.partitions):
                archiver.scan()
                report = archiver.upload_round()
                rounds += 1
                uploaded += sum(p.uploaded_segments for p in report.partitions)
                problems.extend(report.errors)
        finally:
            archiver.close()
            store.close()
    out: dict[str, Any] = {"seconds": round(sw.seconds, 3),
                           "cpu_seconds": round(sw.cpu_seconds, 2),
                           "uploaded_segments": uploaded, "upload_rounds": rounds}
    if problems:
        out["error"] = "; ".join(problems)[-1000:]
    return out


# --- baselines -------------------------------------------------------------------------------


def _key(path: Path) -> str:
    """The same key layout the aws CLI makes from the staging tree: `{topic}-{p}/{file}`."""
    return f"{path.parent.name}/{path.name}"


def _boto3_upload(run: Run, bucket: str, part_concurrency: int) -> dict[str, Any]:
    from boto3.s3.transfer import TransferConfig

    transfer = TransferConfig(
        multipart_threshold=run.multipart_threshold,
        multipart_chunksize=run.multipart_chunksize,
        max_concurrency=part_concurrency,
        use_threads=part_concurrency > 1,
    )
    client = run.moto.client(max_pool_connections=run.concurrency * part_concurrency)
    try:
        with Stopwatch() as sw, ThreadPoolExecutor(run.concurrency) as pool:
            futures = [
                pool.submit(client.upload_file, str(path), bucket, _key(path), Config=transfer)
                for path in run.files
            ]
            for future in futures:
                future.result()
    finally:
        client.close()
    return {"seconds": round(sw.seconds, 3), "cpu_seconds": round(sw.cpu_seconds, 2),
            "part_concurrency": part_concurrency}


def run_boto3(run: Run, bucket: str) -> dict[str, Any]:
    return _boto3_upload(run, bucket, 1)


def run_boto3_parallel_parts(run: Run, bucket: str) -> dict[str, Any]:
    return _boto3_upload(run, bucket, run.part_concurrency)


def find_aws_cli(install: bool) -> tuple[list[str] | None, str]:
    """The aws CLI command, or None and why not. Uses `aws` from PATH when it runs; otherwise
    a private venv under benchmarks/.cache/awscli (created on first use), never the project's
    environment, since awscli pins its own botocore."""
    candidates = []
    on_path = shutil.which("aws")
    if on_path:
        candidates.append(on_path)
    private = AWSCLI_VENV / "bin" / "aws"
    candidates.append(str(private))
    for candidate in candidates:
        if Path(candidate).exists() and _runs([candidate, "--version"]):
            return [candidate], candidate
    if not install:
        return None, "no working `aws` on PATH or in the private venv (--no-install)"
    try:
        progress(f"installing awscli into {AWSCLI_VENV} ...")
        venv.EnvBuilder(with_pip=True, clear=True).create(AWSCLI_VENV)
        pip = subprocess.run(
            [str(AWSCLI_VENV / "bin" / "python"), "-m", "pip", "install", "-q", "awscli"],
            capture_output=True, text=True, timeout=600, check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot create a venv for awscli: {exc}"
    if pip.returncode != 0:
        return None, f"pip install awscli failed: {pip.stderr.strip()[-300:]}"
    if not _runs([str(private), "--version"]):
        return None, "awscli installed but `aws --version` fails"
    return [str(private)], str(private)


def _runs(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def run_aws_cli(run: Run, bucket: str) -> dict[str, Any]:
    aws, where = find_aws_cli(run.install_aws_cli)
    if aws is None:
        return {"skipped": where}
    staging = run.workdir / "aws-staging"
    if not staging.exists():
        # hard links: the same inodes, so the same page-cache pages, under the key layout
        for path in run.files:
            (staging / path.parent.name).mkdir(parents=True, exist_ok=True)
            os.link(path, staging / _key(path))
    aws_config = run.workdir / "aws-config"
    mib = 1024 * 1024
    aws_config.write_text(
        "[default]\nregion = us-east-1\ns3 =\n"
        f"  max_concurrent_requests = {run.concurrency}\n"
        f"  multipart_threshold = {run.multipart_threshold // mib}MB\n"
        f"  multipart_chunksize = {run.multipart_chunksize // mib}MB\n",
        encoding="utf-8",
    )
    env = fake_aws_env()
    env["AWS_CONFIG_FILE"] = str(aws_config)
    cmd = [*aws, "s3", "cp", "--recursive", str(staging), f"s3://{bucket}/",
           "--endpoint-url", run.moto.endpoint, "--only-show-errors", "--no-progress"]
    with Stopwatch() as sw:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=run.cli_timeout_s, check=False)
    out: dict[str, Any] = {"seconds": round(sw.seconds, 3),
                           "cpu_seconds": round(sw.cpu_seconds, 2), "exit_code": proc.returncode,
                           "aws": where, "max_concurrent_requests": run.concurrency}
    if proc.returncode != 0:
        out["error"] = (proc.stderr.strip() or proc.stdout.strip())[-1000:]
    return out


#: contender name -> how to run it into a fresh bucket; the order is the run order
CONTENDERS: dict[str, Callable[[Run, str], dict[str, Any]]] = {
    "boto3": run_boto3,
    "tiered_cli": run_tiered_cli,
    "aws_cli": run_aws_cli,
    "tiered_inprocess": run_tiered_inprocess,
    "boto3_parallel_parts": run_boto3_parallel_parts,
}


def measure(run: Run, name: str) -> dict[str, Any]:
    """Run one contender into a fresh bucket, then count what is there; moto is reset after,
    so the next contender's server holds no earlier gigabyte."""
    bucket = f"bench-{name.replace('_', '-')}"
    run.moto.create_bucket(bucket)
    try:
        result = CONTENDERS[name](run, bucket)
    except Exception as exc:  # one contender's failure is a figure, not the end of the run
        result = {"error": f"{type(exc).__name__}: {exc}"[-1000:]}
    if "skipped" not in result:
        client = run.moto.client()
        try:
            contents = bucket_contents(client, bucket)
        finally:
            client.close()
        seconds = result.get("seconds")
        result.update(
            objects=contents.objects,
            bucket_bytes=contents.bytes,
            segment_objects=contents.log_objects,
            segment_bytes=contents.log_bytes,
            complete=contents.log_bytes == run.segment_bytes
            and contents.log_objects >= len(run.files),
            mb_per_s=mb_per_s(contents.log_bytes, seconds) if seconds else None,
        )
        if contents.log_objects < len(run.files):
            result["missing_segments"] = len(run.files) - contents.log_objects
    run.moto.reset()
    return result


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One contender's runs: the median wall time and its MB/s is the figure; the fastest run
    (the least disturbed by other work on the shared cores) is shown beside it. Incomplete or
    failed runs make the whole contender incomplete."""
    if any("skipped" in r for r in runs):
        return {"skipped": runs[0]["skipped"]}
    complete = all(r.get("complete") for r in runs)
    summary: dict[str, Any] = {"complete": complete}
    if complete:
        seconds = sorted(r["seconds"] for r in runs)
        median = statistics.median(seconds)
        summary.update(
            seconds=round(median, 3),
            cpu_seconds=round(statistics.median(r["cpu_seconds"] for r in runs), 2),
            mb_per_s=mb_per_s(runs[0]["segment_bytes"], median),
            best_mb_per_s=mb_per_s(runs[0]["segment_bytes"], seconds[0]),
        )
    last = runs[-1]
    for key in ("objects", "bucket_bytes", "segment_objects", "segment_bytes"):
        if key in last:
            summary[key] = last[key]
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        summary["error"] = errors[0]
    summary["runs"] = runs
    return summary


def warm_up(run: Run) -> None:
    """Upload a slice of the files once, untimed: moto's first requests (imports, allocation,
    connection set-up) are much slower than its steady state, and whichever contender ran
    first would pay for them."""
    client = run.moto.client(max_pool_connections=run.concurrency)
    run.moto.create_bucket("bench-warm-up")
    budget, chosen = WARM_UP_BYTES, []
    for path in run.files:
        if budget <= 0:
            break
        chosen.append(path)
        budget -= path.stat().st_size
    try:
        with ThreadPoolExecutor(run.concurrency) as pool:
            for future in [pool.submit(client.upload_file, str(p), "bench-warm-up", _key(p))
                           for p in chosen]:
                future.result()
    finally:
        client.close()
    run.moto.reset()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=1024, help="topic size (MiB)")
    parser.add_argument("--segment-mb", type=float, default=128, help="segment size (MiB)")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--record-kb", type=int, default=64, help="record value size (KiB)")
    parser.add_argument("--part-concurrency", type=int, default=10,
                        help="threads per file for boto3_parallel_parts (boto3's default: 10)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS),
                        help=f"comma-separated, from {', '.join(CONTENDERS)}")
    parser.add_argument("--timeout", type=float, default=1800, help="per CLI run (seconds)")
    parser.add_argument("--no-install", action="store_true",
                        help="skip aws_cli when `aws` is missing instead of pip-installing it")
    # 5, not 3: one contender's runs spread up to 2x on 2 shared cores (moto's page faults,
    # mostly), and a median of 3 still moved the ratio by 0.07 between identical runs
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per contender")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--workdir", type=Path, help="keep files here (default: a temp dir)")
    args = parser.parse_args(argv)
    names = [n for n in args.contenders.split(",") if n]
    if unknown := [n for n in names if n not in CONTENDERS]:
        parser.error(f"unknown contenders {unknown}; choose from {list(CONTENDERS)}")
    if min(args.size_mb, args.segment_mb, args.partitions, args.repeats) <= 0:
        parser.error("--size-mb, --segment-mb, --partitions and --repeats must be positive")

    workdir = Path(tempfile.mkdtemp(prefix="tiered-upload-", dir=args.workdir))
    try:
        progress(f"writing {args.size_mb:g} MiB of segments to {workdir / 'log'} ...")
        with Stopwatch() as build:
            files = write_sample_log(
                workdir / "log", topic=TOPIC, partitions=args.partitions,
                total_bytes=int(args.size_mb * MIB), segment_bytes=int(args.segment_mb * MIB),
                record_bytes=args.record_kb * 1024, seed=args.seed,
            )
        read_through(files)
        with MotoServer() as moto:
            moto.create_bucket("bench-probe")  # open_store probes conditional writes
            limits = tiered_limits(write_config(workdir, workdir / "log", moto.endpoint,
                                                "bench-probe", None))
            moto.reset()
            run = Run(
                workdir=workdir, log_dir=workdir / "log", files=files,
                segment_bytes=sum(p.stat().st_size for p in files), moto=moto,
                concurrency=limits.concurrency, shares=limits.max_shares,
                multipart_threshold=limits.multipart_threshold,
                multipart_chunksize=limits.multipart_chunksize,
                part_concurrency=args.part_concurrency, cli_timeout_s=args.timeout,
                install_aws_cli=not args.no_install,
            )
            warm_up(run)
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
            # round robin, so drift in the machine's load hits every contender alike
            for repeat in range(args.repeats):
                for name in names:
                    if runs[name] and "skipped" in runs[name][0]:
                        continue  # e.g. no aws CLI: say so once
                    progress(f"{name} (run {repeat + 1} of {args.repeats}) ...")
                    runs[name].append(measure(run, name))
            results = {name: summarise(r) for name, r in runs.items()}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    def paired(ours: str, theirs: str) -> float | None:
        """The median over repeats of (their seconds / our seconds) within one round: the
        two ran back to back, so a slow spell of the shared machine hits both alike."""
        if not all(results.get(name, {}).get("complete") for name in (ours, theirs)):
            return None
        pairs = zip(runs[ours], runs[theirs], strict=True)
        return round(statistics.median(t["seconds"] / o["seconds"] for o, t in pairs), 3)

    def ratio(ours: str, theirs: str, figure: str = "mb_per_s") -> float | None:
        a, b = results.get(ours, {}), results.get(theirs, {})
        if not (a.get("complete") and b.get("complete")):
            return None
        return round(a[figure] / b[figure], 3)

    emit({
        "benchmark": "upload",
        "size_mb": args.size_mb,
        "segment_mb": args.segment_mb,
        "partitions": args.partitions,
        "segments": len(files),
        "segment_bytes": run.segment_bytes,
        "write_seconds": round(build.seconds, 2),
        "concurrency": {
            "uploads_in_flight": run.concurrency,
            "source": "Archiver(config, store, fixed_shares=max_shares).budget: "
                      "cloud_storage_max_connections at max shares",
            "max_shares": run.shares,
            "tiered_bandwidth_limit_bytes_per_s": limits.bandwidth_bytes_per_s,
        },
        "multipart": {"threshold_bytes": run.multipart_threshold,
                      "chunk_bytes": run.multipart_chunksize},
        "results": results,
        "ratios": {
            "tiered_cli_vs_boto3": ratio("tiered_cli", "boto3"),
            "tiered_inprocess_vs_boto3": ratio("tiered_inprocess", "boto3"),
            "tiered_cli_vs_aws_cli": ratio("tiered_cli", "aws_cli"),
            "tiered_cli_vs_boto3_parallel_parts": ratio("tiered_cli", "boto3_parallel_parts"),
        },
        # per round, then the median: robust to a slow spell that hits some rounds only
        "ratios_paired_by_round": {
            "tiered_cli_vs_boto3": paired("tiered_cli", "boto3"),
            "tiered_inprocess_vs_boto3": paired("tiered_inprocess", "boto3"),
        },
        # the fastest runs, least disturbed by other work on shared cores
        "ratios_best_runs": {
            "tiered_cli_vs_boto3": ratio("tiered_cli", "boto3", "best_mb_per_s"),
            "tiered_inprocess_vs_boto3": ratio("tiered_inprocess", "boto3", "best_mb_per_s"),
        },
        "goal": "tiered_cli_vs_boto3 >= 0.9",
        "cpus": os.cpu_count(),
        "versions": versions("tiered", "boto3", "botocore", "moto"),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
