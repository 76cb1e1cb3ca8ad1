"""Running `tiered` as its own process, as an operator or a supervisor would: the command line
and the environment that makes the child import this checkout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tiered_command(*args: str) -> list[str]:
    """argv for `tiered ARGS` on this interpreter (no console script needed)."""
    return [sys.executable, "-c", "from tiered.cli.main import main; main()", *args]


def child_env() -> dict[str, str]:
    """The environment for a child `tiered`: this checkout first on its path, unbuffered
    output (a test reads its log while it runs)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
