"""The real `tiered run` daemon in a test: on a thread of the test process, stopped after."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from tiered.app.daemon import Daemon, DaemonOptions
from tiered.config import Config


@contextlib.contextmanager
def running(config: Config, **kw: Any) -> Iterator[Daemon]:
    """The real daemon (real archiver, store, reader, HTTP and, with [kafka], the Kafka
    endpoint) on a thread; keyword arguments go to `Daemon`. A failure of the daemon's thread
    fails the test after it stopped."""
    daemon = Daemon(config, DaemonOptions(metrics_port=0), **kw)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            daemon.run()
        except BaseException as exc:  # handed to the test below
            failure.append(exc)

    thread = threading.Thread(target=run, name="daemon")
    thread.start()
    try:
        yield daemon
    finally:
        daemon.request_stop("test over")
        thread.join(timeout=60)
        assert not thread.is_alive(), "the daemon did not stop"
    assert not failure, failure
