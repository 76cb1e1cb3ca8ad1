"""The start-up conditional-write probe (design invariant 6 depends on its verdict)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from faultproxy import DROP_AFTER, FaultProxy
from manifest_fakes import segment
from support.s3 import TEST_MULTIPART_THRESHOLD
from support.stores import IgnoresConditions, IgnoresIfMatch

from manifests import ManifestStore, edits
from manifests.manifest import PartitionManifest
from tiered.store import (
    PROBE_PREFIX,
    STORES,
    ConditionalWritesUnsupported,
    FileStore,
    ObjectStore,
    ProbingStore,
    S3Store,
    StoreSettings,
    open_store,
    probe_conditional_writes,
)
from tiered.store.errors import PreconditionFailed
from tiered.store.probe import VERDICT_KEY, recorded_verdict


def _settings(tmp_path: Path, *, allow_unconditional_writes: bool = False) -> StoreSettings:
    return StoreSettings(
        url=f"file://{tmp_path}/store", allow_unconditional_writes=allow_unconditional_writes
    )


def test_probe_passes_on_the_file_store_and_cleans_up(file_store: FileStore) -> None:
    assert probe_conditional_writes(file_store) is True
    # nothing left but the verdict describe-storage shows
    assert [i.key for i in file_store.list()] == [VERDICT_KEY]
    verdict = recorded_verdict(file_store)
    assert verdict is not None and (verdict["enforced"], verdict["if_match"]) == (True, "native")


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
    # the probe leaves nothing but its recorded verdict
    assert [i.key for i in store.list()] == [VERDICT_KEY]
    verdict = recorded_verdict(store)
    assert verdict is not None and verdict["enforced"] is False


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


@pytest.mark.parametrize("lost", ["create", "final"])
def test_a_lost_answer_to_an_applied_probe_put_does_not_condemn_the_store(
    fault_proxy: FaultProxy, proxied_s3_store: Callable[..., S3Store], lost: str
) -> None:
    """The store applies the put, the connection drops before the answer, the client's retry
    is refused by the write it made itself: the probe checks the content and passes."""
    store = proxied_s3_store()
    if lost == "create":
        fault_proxy.inject(DROP_AFTER, times=1, method="PUT", header="If-None-Match")
    else:  # past the wrong-ETag put (refused anyway): the final If-Match put
        fault_proxy.inject(DROP_AFTER, times=1, method="PUT", header="If-Match", skip=1)
    assert probe_conditional_writes(store) is True
    puts = fault_proxy.seen(method="PUT")
    assert any(s.faulted == DROP_AFTER for s in puts)
    assert len(puts) > 4  # the retry really happened
    assert list(store.list("_tiered/probe/")) == []


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


# --- the probe beside the work (archive --once) ----------------------------------------------


def _held_probe(verdict: BaseException | bool) -> tuple[threading.Event, Callable[..., bool]]:
    """A probe that waits for the returned event, then passes or raises `verdict`."""
    go = threading.Event()

    def probe(store: ObjectStore) -> bool:
        assert go.wait(10)
        if isinstance(verdict, BaseException):
            raise verdict
        return verdict

    return go, probe


def test_probing_store_reads_at_once_and_holds_writes_for_the_verdict(
    file_store: FileStore, tmp_path: Path
) -> None:
    file_store.put("m/manifest.json", b"v1")
    go, probe = _held_probe(True)
    store = ProbingStore(file_store, probe)
    # reads need no proof: they answer while the probe is still out
    assert store.get("m/manifest.json") == b"v1"
    assert store.head("m/manifest.json").size == 2
    assert [i.key for i in store.list("m/")] == ["m/manifest.json"]
    assert store.exists("m/manifest.json")
    etag = store.head("m/manifest.json").etag
    src = tmp_path / "seg.log"
    src.write_bytes(b"segment")
    with ThreadPoolExecutor(3) as pool:
        writes: list[Future[Any]] = [
                  pool.submit(store.put, "m/manifest.json", b"v2", if_match=etag),
                  pool.submit(store.put_file, "seg/0.log", src),
                  pool.submit(store.delete_many, ["nothing/here"])]
        time.sleep(0.2)
        assert not any(w.done() for w in writes)
        assert file_store.get("m/manifest.json") == b"v1" and not file_store.exists("seg/0.log")
        go.set()
        assert [type(w.result()) for w in writes] == [str, str, list]
    assert store.verdict() is True
    assert file_store.get("m/manifest.json") == b"v2" and file_store.get("seg/0.log") == b"segment"
    store.close()


def test_probing_store_failed_probe_fails_every_write_and_nothing_appears(
    s3_store: S3Store, tmp_path: Path
) -> None:
    refused = ConditionalWritesUnsupported("store ignores If-Match")
    go, probe = _held_probe(refused)
    store = ProbingStore(s3_store, probe)
    big = tmp_path / "big.log"
    big.write_bytes(os.urandom(TEST_MULTIPART_THRESHOLD + 1))  # multipart: parts go up first
    small = tmp_path / "small.index"
    small.write_bytes(b"index")
    with ThreadPoolExecutor(2) as pool:
        uploads = [pool.submit(store.put_file, "seg/big.log", big),
                   pool.submit(store.put_file, "seg/small.index", small)]
        time.sleep(0.2)
        go.set()
        for upload in uploads:
            with pytest.raises(ConditionalWritesUnsupported):
                upload.result()
    with pytest.raises(ConditionalWritesUnsupported):
        store.put("m/manifest.json", b"{}", if_none_match=True)
    with pytest.raises(ConditionalWritesUnsupported):
        store.delete_many(["seg/big.log"])
    with pytest.raises(ConditionalWritesUnsupported):
        store.verdict()
    assert list(s3_store.list()) == []
    pending = s3_store._client.list_multipart_uploads(Bucket=s3_store.bucket)
    assert not pending.get("Uploads")  # the big file's parts were aborted
    store.close()


def test_open_store_beside_probes_on_its_own_thread(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(STORES, "file", IgnoresConditions)
    store = open_store(_settings(tmp_path), probe="beside")  # returns before the verdict
    assert isinstance(store, ProbingStore) and isinstance(store.inner, IgnoresConditions)
    with pytest.raises(ConditionalWritesUnsupported, match="lose updates"):
        store.verdict()
    store.close()
    assert list(store.inner.list()) == []  # the probe cleaned up before close returned


def test_a_healthy_start_counts_no_store_error(s3_store: S3Store) -> None:
    """The probe's refused conditions are the answers it asks for, and a missing key is an
    answer too: neither counts in tiered_store_errors_total (an alert on it must not fire on
    every restart)."""
    assert probe_conditional_writes(s3_store) is True
    assert not s3_store.exists("no/such/key")
    counts = s3_store.stats.snapshot()
    assert counts["errors"] == 0 and counts["operations"] > 5


class BareIfMatchOnly(FileStore):
    """Like Ceph RGW 16.2: enforces If-Match, but only matches the ETag spelled bare."""

    condition_forms = ("quoted", "bare")
    form = "quoted"

    def use_condition_form(self, form: str) -> None:
        self.form = form

    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None) -> str:
        if if_match is not None and self.form == "quoted":
            raise PreconditionFailed(f"put {key}: condition not met (quoted ETag)")
        return super().put(key, data, if_none_match=if_none_match, if_match=if_match)


def test_the_probe_finds_the_if_match_spelling_the_server_enforces(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = BareIfMatchOnly(_settings(tmp_path))
    with caplog.at_level(logging.INFO, logger="tiered.store.probe"):
        assert probe_conditional_writes(store) is True
    assert store.form == "bare"
    assert "If-Match sent bare" in caplog.text
    etag = store.put("m", b"1")
    store.put("m", b"2", if_match=etag)  # the store goes on in the form the probe found


class RefusesEveryIfMatch(BareIfMatchOnly):
    """A server that answers 412 to every If-Match, whatever the ETag: nothing to compare."""

    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None) -> str:
        if if_match is not None and self.form != "none":
            raise PreconditionFailed(f"put {key}: condition not met")
        return FileStore.put(self, key, data, if_none_match=if_none_match)


def test_the_opt_out_sends_no_condition_a_server_refuses(tmp_path: Path) -> None:
    """With cloud_storage_allow_unconditional_writes, nothing depends on a condition the
    server ignores or refuses: the store sends plain PUTs, so manifest commits go through
    (and are no longer compare-and-swap: one writer only)."""
    refused = RefusesEveryIfMatch(_settings(tmp_path))
    with pytest.raises(ConditionalWritesUnsupported, match="every form"):
        probe_conditional_writes(refused)
    store = RefusesEveryIfMatch(_settings(tmp_path, allow_unconditional_writes=True))
    assert probe_conditional_writes(store) is False
    assert store.form == "none"
    mstore = ManifestStore(store)
    m, etag = mstore.load("orders", 0, "r")
    for base in range(0, 30, 10):
        def append(m: PartitionManifest, b: int = base) -> PartitionManifest:
            return edits.add_segments(edits.with_term(m, 1), [segment(b, 10, name=f"s{b}.log")])

        assert mstore.update("orders", 0, "r", append).committed
    assert mstore.load("orders", 0, "r")[0].next_offset == 30
