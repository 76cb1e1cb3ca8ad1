"""`tiered run` serving Kafka as its own process, for tests that must see whether a request
kills the daemon (a test's own process would die with it), optionally under an address-space
limit so an allocation of many GiB fails as it would on a host with little memory."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.kafka_endpoint import History
from support.processes import child_env
from support.waiting import wait_until

_LISTENING = re.compile(r"Kafka endpoint on 127\.0\.0\.1:(\d+)")


def _toml(value: Any) -> str:
    return json.dumps(value)  # strings, numbers, lists of strings: JSON spells them as TOML


def write_config(path: Path, history: History, *, kafka: dict[str, Any] | None = None) -> Path:
    """The TOML file of `history`'s daemon (as support.kafka_endpoint.kafka_config has it)
    serving Kafka on a free loopback port."""
    sections: dict[str, dict[str, Any]] = {
        "storage": dict(history.storage),
        "log": {"dirs": [str(history.log_dir)], "retention": "advise"},
        "cache": {"dir": str(path.parent / "cache")},
        "cluster": {"storage_min_free_bytes": 0, "cloud_storage_cache_chunk_size": 8192,
                    "log_retention_ms": -1},
        "kafka": {"listen": "127.0.0.1:0", "group_initial_rebalance_delay_ms": 0,
                  "group_min_session_timeout_ms": 1000, **(kafka or {})},
    }
    path.write_text("".join(
        f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in values.items()) + "\n"
        for name, values in sections.items()))
    return path


class KafkaDaemonProcess:
    """One `tiered run` process; its stderr goes to `log_path`."""

    def __init__(self, config: Path, log_path: Path, *, address_space: int | None = None) -> None:
        self.config, self.log_path = config, log_path
        limit = ("import resource; resource.setrlimit(resource.RLIMIT_AS, "
                 f"({address_space}, {address_space})); " if address_space else "")
        argv = [sys.executable, "-c", f"{limit}from tiered.cli.main import main; main()",
                "run", "--config", str(config), "--metrics-port", "0"]
        with log_path.open("w") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err,
                                         env=child_env())
        self.port = 0

        def listening() -> bool:
            assert self.alive, f"tiered run exited ({self.proc.returncode}):\n{self.log()}"
            found = _LISTENING.search(self.log())
            if found:
                self.port = int(found.group(1))
            return found is not None

        wait_until(listening, "tiered run to serve Kafka", timeout_s=120, interval_s=0.1)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int | None:
        """SIGTERM, then the exit status (None: it had to be killed)."""
        if not self.alive:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
            return None
