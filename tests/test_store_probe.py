"""The start-up conditional-write probe (invariant 6 depends on its verdict)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from faultproxy import FaultProxy

from tiered.store import (
    PROBE_PREFIX,
    STORES,
    ConditionalWritesUnsupported,
    FileStore,
    ObjectStore,
    S3Store,
    StoreSettings,
    open_store,
    probe_conditional_writes,
)


class IgnoresConditions(FileStore):
    """A store like some S3 clones: takes If-Match / If-None-Match and ignores them."""

    def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        return super().put(key, data)


class IgnoresIfMatch(FileStore):
    """Honours If-None-Match only: CAS replaces of a manifest would still lose updates."""

    def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        return super().put(key, data, if_none_match=if_none_match)


def _settings(tmp_path: Path, *, allow_unconditional_writes: bool = False) -> StoreSettings:
    return StoreSettings(
        url=f"file://{tmp_path}/store", allow_unconditional_writes=allow_unconditional_writes
    )


def test_probe_passes_on_the_file_store_and_cleans_up(file_store: FileStore) -> None:
    assert probe_conditional_writes(file_store) is True
    assert list(file_store.list()) == []


def test_probe_passes_on_s3(s3_store: S3Store) -> None:
    assert probe_conditional_writes(s3_store) is True
    assert list(s3_store.list(PROBE_PREFIX)) == []


def test_store_ignoring_conditions_is_refused(tmp_path: Path) -> None:
    store = IgnoresConditions(_settings(tmp_path))
    with pytest.raises(ConditionalWritesUnsupported) as caught:
        probe_conditional_writes(store)
    message = str(caught.value)
    assert "If-None-Match" in message and "If-Match" in message
    assert "lose updates" in message
    assert "cloud_storage_allow_unconditional_writes" in message
    assert "allow_unconditional_writes" in message
    assert "only safe with exactly one writer" in message
    assert list(store.list()) == []  # the probe object is gone all the same


def test_store_ignoring_only_if_match_is_refused(tmp_path: Path) -> None:
    store = IgnoresIfMatch(_settings(tmp_path))
    with pytest.raises(ConditionalWritesUnsupported, match="wrong ETag") as caught:
        probe_conditional_writes(store)
    assert "If-None-Match: * put overwrote" not in str(caught.value)


def test_opt_out_warns_and_continues(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = IgnoresConditions(_settings(tmp_path, allow_unconditional_writes=True))
    with caplog.at_level(logging.WARNING, logger="tiered.store.probe"):
        assert probe_conditional_writes(store) is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "does not enforce conditional writes" in warnings[0].getMessage()
    assert "only safe with exactly one writer" in warnings[0].getMessage()
    assert list(store.list()) == []


def test_open_store_probes_and_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(STORES, "file", IgnoresConditions)
    with pytest.raises(ConditionalWritesUnsupported):
        open_store(_settings(tmp_path))
    # probe=False is for executors whose driver already probed
    store = open_store(_settings(tmp_path), probe=False)
    assert isinstance(store, IgnoresConditions)
    store.close()


def test_s3_endpoint_rejecting_conditions_is_refused(
    fault_proxy: FaultProxy, proxied_s3_store: Callable[..., S3Store]
) -> None:
    """An S3 clone answering 501 NotImplemented to the condition headers."""
    store = proxied_s3_store()
    fault_proxy.inject("notimplemented", times=10, method="PUT", header="If-None-Match")
    with pytest.raises(ConditionalWritesUnsupported, match="rejects conditional puts"):
        probe_conditional_writes(store)
    # 501 is not transient: exactly one attempt
    assert len(fault_proxy.seen(method="PUT")) == 1


def test_s3_opt_out_writes_without_conditions_on_such_an_endpoint(
    fault_proxy: FaultProxy,
    proxied_s3_store: Callable[..., S3Store],
    caplog: pytest.LogCaptureFixture,
) -> None:
    store: ObjectStore = proxied_s3_store(allow_unconditional_writes=True)
    fault_proxy.inject("notimplemented", times=100, method="PUT", header="If-None-Match")
    fault_proxy.inject("notimplemented", times=100, method="PUT", header="If-Match")
    with caplog.at_level(logging.WARNING):
        assert probe_conditional_writes(store) is False
        store.put("m/manifest.json", b"v1", if_none_match=True)
    assert store.get("m/manifest.json") == b"v1"
    assert any("only safe with exactly one writer" in r.getMessage() for r in caplog.records)
