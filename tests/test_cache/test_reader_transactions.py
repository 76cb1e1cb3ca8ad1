"""Aborted transactions for read_committed fetches: the Reader answers from the `.txnindex`
objects the archiver uploaded for offsets that left the local disk, and from the local files
for the rest, exactly the aborted transactions overlapping the range (Kafka's answer), and
remembers what it read of the bucket (segment objects never change)."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest
from support.remote import (
    TOPIC,
    CountingStore,
    archive,
    as_earlier_releases_wrote,
    drop_local_segments,
    make_config,
)

from cache.reader import Reader
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.local_log import LocalLog
from tiered.kafka.log_writer import LogWriter, ProducerRecord
from tiered.kafka.txnindex import AbortedTxn
from tiered.store import FileStore, StoreSettings
from tiered.store.errors import ObjectNotFound


def _write(config_dir: Path, seed: int) -> tuple[list[tuple[int, int, int]], int]:
    """Interleaved transactions of 3 producers with plain batches between; returns the aborted
    ones as (producer, first offset, marker offset) and the log end."""
    rng = random.Random(seed)
    aborted = []
    open_first: dict[int, int] = {}
    with LogWriter(config_dir / f"{TOPIC}-0", segment_bytes=700, fsync=False,
                   topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, TOPIC),
                   clock=lambda: 1.7e9) as w:
        for _ in range(250):
            pid = rng.randrange(3)
            roll = rng.random()
            if roll < 0.3:
                w.append([ProducerRecord(b"plain")])
            elif pid in open_first and roll < 0.5:
                kind = rng.choice(["commit", "abort"])
                marker = w.log_end_offset
                w.append_control(kind, producer_id=pid, producer_epoch=0)
                first = open_first.pop(pid)
                if kind == "abort":
                    aborted.append((pid, first, marker))
            else:
                base = w.append([ProducerRecord(b"t" * 40)], producer_id=pid, producer_epoch=0,
                                base_sequence=0, transactional=True).base_offset
                open_first.setdefault(pid, base)
        for pid in sorted(open_first):  # close every transaction: everything is stable
            w.append_control("abort", producer_id=pid, producer_epoch=0)
            aborted.append((pid, open_first[pid], w.log_end_offset - 1))
        w.roll()
        return aborted, w.log_end_offset


@pytest.mark.parametrize("earlier_release", [False, True], ids=["bundles", "kafka_files"])
def test_aborted_transactions_from_bucket_and_local_files(tmp_path: Path,
                                                          earlier_release: bool) -> None:
    """From the index bundles, and from the `.txnindex` objects of a bucket written before
    them."""
    config = make_config(tmp_path)
    aborted, end = _write(config.log_dirs[0], seed=5)
    assert len(aborted) > 10
    store = CountingStore(FileStore(StoreSettings(url=(tmp_path / "bucket").as_uri())))
    archive(config, store)
    if earlier_release:
        as_earlier_releases_wrote(store)
        assert [i for i in store.list("") if i.key.endswith(".txnindex")]
    drop_local_segments(config, below=end // 2)  # the first half only in the bucket
    local_start = LocalLog(config.log_dirs).partition(TopicPartition(TOPIC, 0)).log_start_offset
    assert local_start is not None and 0 < local_start < end
    with Reader(config, store, local_log=LocalLog(config.log_dirs),
                metadata_ttl_s=60.0) as reader:
        for start, upper in [(0, end), (0, 5), (local_start - 3, local_start + 3),
                             (end // 3, end // 3 + 20), (local_start, end), (end - 4, end)]:
            got = reader.aborted_transactions(TOPIC, 0, start, upper)
            want = {(p, f, last) for p, f, last in aborted if last >= start and f < upper}
            assert {(t.producer_id, t.first_offset, t.last_offset) for t in got} == want
            assert all(isinstance(t, AbortedTxn) for t in got)
            assert len(got) == len(want)  # no entry twice
        gets = store.calls.get("get", 0)
        reader.aborted_transactions(TOPIC, 0, 0, end)
        assert store.calls.get("get", 0) == gets  # the bucket's indexes were remembered
        assert reader.stats["txnindex_downloads"] > 0


def test_a_lost_index_bundle_fails_a_read_committed_answer_rather_than_omit_aborts(
        tmp_path: Path) -> None:
    """Absence is not evidence: without its bundle, which transactions of a segment were
    aborted is unknown, and answering "none" would hand aborted records to a read_committed
    consumer."""
    config = make_config(tmp_path)
    aborted, end = _write(config.log_dirs[0], seed=7)
    store = FileStore(StoreSettings(url=(tmp_path / "bucket").as_uri()))
    archive(config, store)
    drop_local_segments(config)
    bundles = [i.key for i in store.list("") if i.key.endswith(".indexes")]
    store.delete_many(bundles[:1])
    with Reader(config, store, local_log=LocalLog(config.log_dirs),
                metadata_ttl_s=60.0) as reader, pytest.raises(ObjectNotFound):
        reader.aborted_transactions(TOPIC, 0, 0, end)
