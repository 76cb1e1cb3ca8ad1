"""How long a `tiered` command takes to start and finish a small job, against the interpreter's
own start-up in the same run: `python -c pass` and `python -c "import boto3"`.

Commands: `tiered --help`; `describe-storage` and `fetch` of a local offset on a `file://`
configuration; a no-op `archive --once` (everything already uploaded) against a moto server.
Each runs `--runs` times as a fresh process; prints one JSON object with the median and the
best time of each, and each median's difference from `python -c pass`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import MotoServer, emit, fake_aws_env, versions

from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.log_writer import LogWriter, ProducerRecord, write_high_watermarks

TIERED = [sys.executable, "-c", "from tiered.cli.main import main; main()"]


def _write_log(log_dir: Path) -> None:
    with LogWriter(log_dir / "orders-0", segment_bytes=64 * 1024, fsync=False) as w:
        for i in range(400):
            w.append([ProducerRecord(b"v" * 200, key=b"k%d" % i)])
        end = w.log_end_offset
    write_high_watermarks(log_dir, {TopicPartition("orders", 0): end}, fsync=False)


def _config(path: Path, url: str, log_dir: Path, extra: str = "") -> Path:
    path.write_text(f'[storage]\nurl = "{url}"\n{extra}[log]\ndirs = ["{log_dir}"]\n'
                    f'[cache]\ndir = "{path.parent / "cache"}"\n')
    return path


def _time(argv: list[str], runs: int, env: dict[str, str]) -> dict[str, float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        times.append(time.perf_counter() - t0)
        if done.returncode != 0:
            raise SystemExit(f"{argv[3:] or argv}: exit {done.returncode}: "
                             f"{done.stderr.decode(errors='replace')[-500:]}")
    return {"median_s": round(statistics.median(times), 4), "best_s": round(min(times), 4)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each command (default 10)")
    args = parser.parse_args(argv)
    env = fake_aws_env()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="tiered-cli-") as tmp, MotoServer() as moto:
        work = Path(tmp)
        log_dir = work / "log"
        _write_log(log_dir)
        local = _config(work / "file.toml", (work / "bucket").as_uri(), log_dir)
        moto.create_bucket("cli")
        s3 = _config(work / "s3.toml", "s3://cli/pfx", log_dir,
                     f'endpoint_url = "{moto.endpoint}"\nregion = "us-east-1"\n'
                     'access_key = "testing"\nsecret_key = "testing"\n')
        for cfg in (local, s3):  # everything uploaded: the timed passes have nothing to do
            subprocess.run([*TIERED, "-q", "archive", "--once", "--config", str(cfg)],
                           check=True, env=env, capture_output=True)
        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "python -c 'import boto3'": [sys.executable, "-c", "import boto3"],
            "tiered --help": [*TIERED, "--help"],
            "tiered describe-storage (file://)": [*TIERED, "-q", "describe-storage", "--config",
                                                  str(local)],
            "tiered fetch, local offset (file://)": [*TIERED, "-q", "fetch", "--config",
                                                     str(local), "--topic", "orders",
                                                     "--partition", "0", "--offset", "10"],
            "tiered archive --once, nothing to do (s3://, moto)": [
                *TIERED, "-q", "archive", "--once", "--config", str(s3)],
        }
        for name, command in cases.items():
            results[name] = _time(command, args.runs, env)
    base = results["python -c pass"]["median_s"]
    for row in results.values():
        row["over_python_s"] = round(row["median_s"] - base, 4)
    emit({"benchmark": "cli_startup", "runs": args.runs, "results": results,
          "goals_s": {"tiered --help": "python -c pass + 0.15",
                      "describe-storage, local fetch (file://)": 0.3,
                      "archive --once no-op (s3://)": 0.5},
          "versions": versions("click", "boto3")})


if __name__ == "__main__":
    main()
