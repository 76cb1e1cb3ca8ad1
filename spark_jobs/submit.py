"""The one file `spark-submit` runs: `spark-submit spark_jobs/submit.py JOB ARGS...`.

JOB is `compact`, `merge`, `recover` or `scrub`, with the same arguments as `tiered JOB`, run
through the same command (its logging, its one-line errors and exit codes), so a job behaves alike
whether a user starts it with `tiered` or hands it to a cluster. This is an entry point like
the CLI itself: it sits above the layers it starts (docs/design.md).
"""

from __future__ import annotations

import sys

JOBS = ("compact", "merge", "recover", "scrub")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in JOBS:
        print(f"usage: spark-submit spark_jobs/submit.py {{{'|'.join(JOBS)}}} [ARGS...]",
              file=sys.stderr)
        sys.exit(2)
    from tiered.cli.main import main as tiered_main

    tiered_main(args)


if __name__ == "__main__":
    main()
