"""The `tiered` group loads each subcommand's module only when it is used, and lists them all
in `--help` without importing any: startup stays cheap (benchmarks/cli_startup.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tiered.cli.main import COMMANDS, cli, load_command

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("boto3", "botocore", "pyspark", "prometheus_client", "cache", "archiver", "spark_jobs")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_registry_short_help_is_the_commands_own(name: str) -> None:
    command = load_command(name)
    assert command.name == name
    assert COMMANDS[name][1] == command.get_short_help_str(limit=200)


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name, (_, short) in COMMANDS.items():
        assert name in result.output and short.split()[0] in result.output


def _loaded_after(*args: str) -> list[str]:
    code = ("import sys\nfrom tiered.cli.main import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    return eval(run.stdout.strip().splitlines()[-1])  # a printed list of names


def test_help_imports_no_backend_no_spark_and_no_service() -> None:
    assert _loaded_after("--help") == []


def test_a_file_store_describe_storage_never_imports_boto3_or_spark(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    config = tmp_path / "tiered.toml"
    config.write_text(f'[storage]\nurl = "{(tmp_path / "bucket").as_uri()}"\n'
                      f'[log]\ndirs = ["{log}"]\n')
    loaded = _loaded_after("-q", "describe-storage", "--config", str(config))
    assert not {"boto3", "botocore", "pyspark"} & set(loaded), loaded
