"""The `tiered` command line: one click group (`tiered.cli.main`)."""

from tiered.cli.main import main

__all__ = ["main"]
