"""Project-level contracts: the README's commands, CI, the dev stack's compose file, packaging."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```sh\n(.*?)\n```", text, flags=re.S)


def test_readme_has_exactly_two_setup_commands() -> None:
    commands = _readme_commands()
    assert len(commands) == 2, commands
    assert all("\n" not in c for c in commands), "each set-up command is one line"
    main_job, tests = commands
    assert "tiered demo" in main_job
    assert "pytest" in tests and "[dev]" in tests


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    match = re.search(r'^TEST_COMMAND="(.*)"$', ci, flags=re.M)
    assert match, ".ci/run must define TEST_COMMAND"
    assert match.group(1) == _readme_commands()[1]
    assert "git clone" in ci, ".ci/run tests a clean clone"
    assert re.search(r'"\$rc" -eq 5', ci), "pytest's 'no tests' exit (5) must fail CI"


def test_ci_runs_the_linters_before_the_tests_and_fails_on_them() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    lint = re.search(r'^LINT_COMMAND="(.*)"$', ci, flags=re.M)
    assert lint, ".ci/run must define LINT_COMMAND"
    assert all(tool in lint.group(1) for tool in ("ruff check", "mypy", "lint-imports"))
    assert ci.index('bash -c "$LINT_COMMAND"') < ci.index('bash -c "$TEST_COMMAND"')
    # a linter's failure ends the run with its exit code
    after = ci[ci.index('bash -c "$LINT_COMMAND"'):ci.index('bash -c "$TEST_COMMAND"')]
    assert 'exit "$rc"' in after


def test_tests_never_install_on_the_host() -> None:
    """Tests never change the host: CI installs tools, a missing one skips with its name."""
    # the installer's name spelled apart, so this guard is not itself a hit
    installer = "apt" + "-get"
    offenders = [p.relative_to(ROOT) for p in (ROOT / "tests").rglob("*.py")
                 if installer in p.read_text()]
    assert offenders == []
    assert installer in (ROOT / ".ci" / "run").read_text()


def test_pyproject_layout_and_extras() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = meta["project"]
    assert project["name"] == "tiered"
    assert project["requires-python"] == ">=3.11"
    assert project["scripts"]["tiered"] == "tiered.cli:main"
    # the daemon alone must not pull in Spark
    assert not any(dep.startswith("pyspark") for dep in project["dependencies"])
    assert any(dep.startswith("pyspark") for dep in project["optional-dependencies"]["spark"])
    assert "tiered[spark]" in project["optional-dependencies"]["dev"]
    # every dependency pins a lower bound
    for dep in project["dependencies"] + project["optional-dependencies"]["dev"]:
        assert ">=" in dep or dep.startswith("tiered["), dep
    for package in ("tiered", "archiver", "cache", "manifests", "spark_jobs"):
        assert (ROOT / package / "__init__.py").is_file(), package


def test_docker_compose_dev_stack_is_consistent() -> None:
    """docker compose cannot run here: check the file's wiring instead."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"minio", "create-bucket", "tiered"} <= set(services)

    minio = services["minio"]
    assert minio["image"].startswith("minio/minio:") and ":latest" not in minio["image"]
    assert "9000:9000" in minio["ports"]
    user = minio["environment"]["MINIO_ROOT_USER"]
    password = minio["environment"]["MINIO_ROOT_PASSWORD"]

    bucket_job = services["create-bucket"]
    assert bucket_job["depends_on"]["minio"]["condition"] == "service_healthy"
    assert "healthcheck" in minio

    daemon = services["tiered"]
    assert daemon["depends_on"]["create-bucket"]["condition"] == (
        "service_completed_successfully"
    )
    assert daemon["environment"]["AWS_ACCESS_KEY_ID"] == user
    assert daemon["environment"]["AWS_SECRET_ACCESS_KEY"] == password
    config_rel = re.search(r"--config ([^\s\"]+)", daemon["command"]).group(1)  # type: ignore[union-attr]
    config_file = ROOT / config_rel
    assert config_file.is_file(), config_rel

    # the daemon's config points at the MinIO service and the bucket the job creates
    from tiered.config import load_config

    config = load_config(config_file)
    assert config.storage.endpoint_url == "http://minio:9000"
    bucket = config.storage.url.removeprefix("s3://").split("/")[0]
    assert f"local/{bucket}" in bucket_job["entrypoint"]
    assert "http://minio:9000" in bucket_job["entrypoint"]
    # a one-shot job seeds the log dir the daemon archives, before the daemon starts
    seed = services["seed-log"]
    assert daemon["depends_on"]["seed-log"]["condition"] == "service_completed_successfully"
    seed_script = re.search(r"python (examples/\S+\.py) (\S+?)\"?$", seed["command"].strip())
    assert seed_script, seed["command"]
    assert (ROOT / seed_script.group(1)).is_file()
    assert seed_script.group(2) in {str(d) for d in config.log_dirs}
    assert {v.split(":")[1] for v in seed["volumes"]} >= {str(d) for d in config.log_dirs}
    # the log dir the daemon reads is the one the compose file mounts
    mounts = {v.split(":")[1] for v in daemon["volumes"] if ":" in v}
    assert {str(d) for d in config.log_dirs} <= mounts
    assert str(config.cache_dir) in mounts


def test_imports_keep_the_layer_contract() -> None:
    """docs/design.md, "Layers": `lint-imports` checks the contract in pyproject.toml."""
    lint = Path(sys.executable).parent / "lint-imports"
    run = subprocess.run([str(lint)], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken." in run.stdout


def test_cli_help_and_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tiered.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in ("config", "log"):
        assert command in out
    version = subprocess.run(
        [sys.executable, "-m", "tiered.cli", "--version"], capture_output=True, text=True
    )
    assert version.returncode == 0 and "tiered" in version.stdout


def test_docker_compose_daemon_config_passes_config_check() -> None:
    from click.testing import CliRunner

    from tiered.cli.main import cli

    # the file is the container's: its log dir exists there, not here
    result = CliRunner().invoke(cli, ["config", "check", "--config", "examples/minio.toml",
                                      "--skip-dir-check"])
    assert result.exit_code == 0, result.output
    assert "s3://tiered" in result.output


@pytest.mark.slow  # a process
def test_seed_script_writes_a_log_the_local_log_reader_accepts(tmp_path: Path) -> None:
    from tiered.config import parse_config
    from tiered.kafka.local_log import LocalLog

    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "seed_log.py"), str(tmp_path)],
        capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stderr
    log = LocalLog([tmp_path])
    log.scan()
    partitions = list(log)
    assert partitions and all(p.closed_segments and p.high_watermark for p in partitions)
    # a broker's log dir names its node: the sidecar is named after it, not the host
    config = parse_config({"storage": {"url": "s3://bucket"}, "log": {"dirs": [str(tmp_path)]}},
                          source="<test>")
    assert config.node_id() == "1"


def test_docs_describe_the_system_not_its_history() -> None:
    """The docs say what is; git keeps the history, so no commit hashes in prose."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    commit = re.compile(r"\bcommits? [0-9a-f]{7,40}\b", flags=re.I)
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in pages
             for m in commit.finditer(p.read_text())]
    assert found == []


def test_performance_page_covers_every_benchmark() -> None:
    """docs/performance.md says, for every script in benchmarks/, how to rerun it."""
    text = (ROOT / "docs" / "performance.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")
                     if not p.name.startswith("_"))
    assert scripts
    assert [s for s in scripts if f"benchmarks/{s}" not in text] == []
    assert "docs/performance.md" in (ROOT / "README.md").read_text()
