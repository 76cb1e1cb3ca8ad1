"""The object-store contract, run against every registered backend (`store` fixture), then the
guarantees only one backend can show (file store: hostile keys, cross-process CAS, crash
leftovers; S3: multipart ETags, prefix isolation, the credential chain)."""

from __future__ import annotations

import base64
import hashlib
import io
import multiprocessing
import os
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import crc32c
import pytest
from support.s3 import EXTERNAL_S3, TEST_MULTIPART_THRESHOLD, no_sleep, s3_settings

import tiered.store.s3
from tiered.store import (
    FileStore,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    S3Store,
    StoreError,
    StoreSettings,
)
from tiered.store.file import ETAG_DIR, LOCK_DIR, TMP_MARK
from tiered.store.multipart import FileRange, part_size

# -- the contract, every backend -------------------------------------------------------------


def test_put_get_head_round_trip(store: ObjectStore) -> None:
    data = bytes(range(256)) * 40
    etag = store.put("topic/0_1/00000000000000000000.log", data)
    assert store.get("topic/0_1/00000000000000000000.log") == data
    info = store.head("topic/0_1/00000000000000000000.log")
    assert (info.key, info.size, info.etag) == ("topic/0_1/00000000000000000000.log", 10240, etag)
    assert etag == hashlib.md5(data).hexdigest()  # single-part ETag: MD5 of the content
    assert info.last_modified > 0
    assert store.exists("topic/0_1/00000000000000000000.log")
    assert not store.exists("topic/0_1/missing.log")


def test_empty_object(store: ObjectStore) -> None:
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.head("empty").size == 0
    assert store.get("empty", (0, 10)) == b""


def test_unconditional_put_replaces(store: ObjectStore) -> None:
    first = store.put("k", b"one")
    second = store.put("k", b"two!")
    assert first != second
    assert store.get("k") == b"two!"
    assert store.head("k").etag == second


def test_ranged_get(store: ObjectStore) -> None:
    store.put("r", b"0123456789")
    assert store.get("r", (0, 4)) == b"0123"
    assert store.get("r", (3, 8)) == b"34567"
    assert store.get("r", (9, 10)) == b"9"
    assert store.get("r", (8, 100)) == b"89"  # past the end: what exists
    assert store.get("r", (10, 20)) == b""  # starts at the end
    assert store.get("r", (50, 60)) == b""  # starts past the end
    assert store.get("r", (4, 4)) == b""  # empty range
    with pytest.raises(ValueError, match="bad byte range"):
        store.get("r", (5, 2))
    with pytest.raises(ValueError, match="bad byte range"):
        store.get("r", (-1, 2))


def test_open_range_streams_the_range_by_read_or_readinto(store: ObjectStore) -> None:
    data = os.urandom(300_000)
    store.put("s", data)
    for begin, end in ((0, len(data)), (1000, 250_000)):
        body = store.open_range("s", begin, end)
        got = bytearray()
        while piece := body.read(70_000):
            got += piece
        body.close()
        assert got == data[begin:end]
        body = store.open_range("s", begin, end)
        buf = memoryview(bytearray(70_000))
        got = bytearray()
        while n := body.readinto(buf):
            got += buf[:n]
        body.close()
        assert got == data[begin:end]


def test_get_returns_the_etag_of_the_version_it_read(store: ObjectStore) -> None:
    first = store.put("v", b"first version")
    got = store.get("v")
    assert got == b"first version" and got.etag == first == store.head("v").etag
    second = store.put("v", b"second", if_match=first)
    assert store.get("v").etag == second
    # a range carries the whole object's ETag, so a reader can tell versions apart
    assert store.get("v", (0, 3)).etag == second
    assert store.get("v", (3, 3)).etag == second
    assert store.get("v", (50, 60)).etag == second
    # and pickles as itself (Spark ships results between processes)
    assert pickle.loads(pickle.dumps(got)).etag == first


def test_missing_key_is_object_not_found(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound, match="no/such/key"):
        store.get("no/such/key")
    with pytest.raises(ObjectNotFound, match="no/such/key"):
        store.get("no/such/key", (0, 10))
    with pytest.raises(ObjectNotFound, match="no/such/key"):
        store.get("no/such/key", (3, 3))
    with pytest.raises(ObjectNotFound, match="no/such/key"):
        store.head("no/such/key")


def test_prefix_of_a_key_is_not_an_object(store: ObjectStore) -> None:
    store.put("dir/leaf", b"x")
    with pytest.raises(ObjectNotFound):
        store.head("dir")
    with pytest.raises(ObjectNotFound):
        store.get("dir")
    # nor is anything "below" an object
    with pytest.raises(ObjectNotFound):
        store.head("dir/leaf/deeper")
    with pytest.raises(ObjectNotFound):
        store.get("dir/leaf/deeper", (0, 1))
    assert store.delete_many(["dir", "dir/leaf/deeper"]) == []
    assert store.get("dir/leaf") == b"x"


def test_list_is_in_key_order_and_filters_by_prefix(store: ObjectStore) -> None:
    # '-' (0x2d) < '/' (0x2f) < '0' (0x30): S3's byte order, not directory-walk order
    keys = ["a/x", "a-b", "a0", "a/b/c", "b", "a/b-", "t\u00e9/\u00fc 1", "a/b/c2"]
    for i, key in enumerate(keys):
        store.put(key, b"v" * i)
    listed = list(store.list())
    assert [i.key for i in listed] == sorted(keys)
    assert [i.size for i in listed] == [keys.index(k) for k in sorted(keys)]
    assert {i.key: i.etag for i in listed} == {k: store.head(k).etag for k in keys}
    assert [i.key for i in store.list("a/")] == ["a/b-", "a/b/c", "a/b/c2", "a/x"]
    assert [i.key for i in store.list("a/b")] == ["a/b-", "a/b/c", "a/b/c2"]
    assert [i.key for i in store.list("a/b/")] == ["a/b/c", "a/b/c2"]
    assert [i.key for i in store.list("zzz")] == []
    # prefixes that name directories whole, part of a name, an object, or nothing
    assert [i.key for i in store.list("a/b/c")] == ["a/b/c", "a/b/c2"]
    assert [i.key for i in store.list("a/b/c2")] == ["a/b/c2"]
    assert [i.key for i in store.list("a/b/c/")] == []  # below an object: nothing
    assert [i.key for i in store.list("a/x/y/")] == []
    assert [i.key for i in store.list("no/such/dir/")] == []
    assert [i.key for i in store.list("t\u00e9/")] == ["t\u00e9/\u00fc 1"]


@pytest.mark.slow  # thousands of objects
def test_list_paginates_and_delete_many_batches_past_1000(store: ObjectStore) -> None:
    keys = [f"many/{i:05d}" for i in range(1100)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put(k, k.encode()), keys))
    store.put("other/keep", b"k")
    assert [i.key for i in store.list("many/")] == keys
    assert len(list(store.list())) == 1101

    assert store.delete_many(iter(keys)) == []  # any iterable, consumed once
    assert list(store.list("many/")) == []
    assert [i.key for i in store.list()] == ["other/keep"]


def test_delete_many_ignores_missing_and_duplicate_keys(store: ObjectStore) -> None:
    store.put("d/1", b"1")
    store.put("d/2", b"2")
    assert store.delete_many(["d/1", "d/1", "d/never", "d/2"]) == []
    assert not store.exists("d/1")
    assert not store.exists("d/2")
    assert store.delete_many([]) == []


def test_conditional_create(store: ObjectStore) -> None:
    etag = store.put("m/manifest.json", b"v1", if_none_match=True)
    with pytest.raises(PreconditionFailed, match="m/manifest.json"):
        store.put("m/manifest.json", b"v2", if_none_match=True)
    assert store.get("m/manifest.json") == b"v1"
    assert store.head("m/manifest.json").etag == etag


def test_if_match_replace(store: ObjectStore) -> None:
    v1 = store.put("m/manifest.json", b"v1", if_none_match=True)
    v2 = store.put("m/manifest.json", b"v2", if_match=v1)
    assert store.get("m/manifest.json") == b"v2"
    assert store.head("m/manifest.json").etag == v2
    # a writer still holding v1 lost the race: nothing is written
    with pytest.raises(PreconditionFailed, match="m/manifest.json"):
        store.put("m/manifest.json", b"stale", if_match=v1)
    with pytest.raises(PreconditionFailed):
        store.put("m/manifest.json", b"wrong", if_match="0" * 32)
    assert store.get("m/manifest.json") == b"v2"
    # quoted ETags (as S3 prints them) are the same version token
    v3 = store.put("m/manifest.json", b"v3", if_match=f'"{v2}"')
    assert store.head("m/manifest.json").etag == v3


def test_if_match_on_a_missing_key_fails(store: ObjectStore) -> None:
    with pytest.raises(PreconditionFailed):
        store.put("m/gone.json", b"x", if_match="0" * 32)
    assert not store.exists("m/gone.json")


def test_both_conditions_at_once_are_refused(store: ObjectStore) -> None:
    with pytest.raises(ValueError, match="mutually exclusive"):
        store.put("k", b"x", if_none_match=True, if_match="abc")


def test_put_file_multipart_keeps_content(store: ObjectStore, tmp_path: Path) -> None:
    size = 2 * TEST_MULTIPART_THRESHOLD + 12345  # three parts: 5 MiB, 5 MiB, the rest
    data = os.urandom(size)
    src = tmp_path / "segment.log"
    src.write_bytes(data)
    etag = store.put_file("seg/big.log", src)
    info = store.head("seg/big.log")
    assert (info.size, info.etag) == (size, etag)
    assert hashlib.sha256(store.get("seg/big.log")).digest() == hashlib.sha256(data).digest()
    # a range across the first part boundary
    edge = TEST_MULTIPART_THRESHOLD
    assert store.get("seg/big.log", (edge - 100, edge + 100)) == data[edge - 100 : edge + 100]


def test_put_file_small_and_put_large_bytes(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "small.log"
    src.write_bytes(b"small segment")
    assert store.put_file("seg/small.log", src) == store.head("seg/small.log").etag
    assert store.get("seg/small.log") == b"small segment"

    big = os.urandom(TEST_MULTIPART_THRESHOLD + 1)  # unconditional put above the threshold
    etag = store.put("seg/big-bytes.log", big)
    assert store.head("seg/big-bytes.log").etag == etag
    assert store.get("seg/big-bytes.log") == big


@pytest.mark.parametrize("size", [100, 2 * TEST_MULTIPART_THRESHOLD + 7],
                         ids=["single", "multipart"])
def test_put_file_ready_runs_before_the_object_appears(
    store: ObjectStore, tmp_path: Path, size: int
) -> None:
    # the archiver sends a segment while verifying it: the object must not be visible
    # until ready() returned
    data = os.urandom(size)
    src = tmp_path / "segment.log"
    src.write_bytes(data)
    seen: list[bool] = []

    def ready() -> None:
        seen.append(store.exists("seg/held.log"))

    etag = store.put_file("seg/held.log", src, ready=ready)
    assert seen == [False]
    assert store.head("seg/held.log").etag == etag
    assert store.get("seg/held.log") == data


class Refused(Exception):
    """Stands in for a failed verification."""


@pytest.mark.parametrize("size", [100, 2 * TEST_MULTIPART_THRESHOLD + 7],
                         ids=["single", "multipart"])
def test_put_file_ready_raising_leaves_no_object(
    store: ObjectStore, tmp_path: Path, size: int
) -> None:
    src = tmp_path / "segment.log"
    src.write_bytes(os.urandom(size))

    def refuse() -> None:
        raise Refused("corrupt batch at byte 42")

    with pytest.raises(Refused, match="byte 42"):  # the caller's error, not a store error
        store.put_file("seg/refused.log", src, ready=refuse)
    assert not store.exists("seg/refused.log")
    assert list(store.list("seg/")) == []


@pytest.mark.parametrize("size", [100, 2 * TEST_MULTIPART_THRESHOLD + 7],
                         ids=["single", "multipart"])
def test_put_file_of_a_byte_range_uploads_exactly_those_bytes(
    store: ObjectStore, tmp_path: Path, size: int
) -> None:
    # the rest of a segment after the batch where another writer's upload ended
    head = 4321
    data = os.urandom(head + size + 99)
    src = tmp_path / "segment.log"
    src.write_bytes(data)
    seen: list[bool] = []
    etag = store.put_file("seg/suffix.log", src, byte_range=(head, head + size),
                          ready=lambda: seen.append(store.exists("seg/suffix.log")))
    assert seen == [False]
    assert store.head("seg/suffix.log").size == size
    assert store.head("seg/suffix.log").etag == etag
    assert store.get("seg/suffix.log") == data[head:head + size]


def test_put_file_of_a_range_past_the_file_is_a_store_error(
    store: ObjectStore, tmp_path: Path
) -> None:
    src = tmp_path / "segment.log"
    src.write_bytes(b"x" * 100)
    with pytest.raises(StoreError, match="not within"):
        store.put_file("seg/x.log", src, byte_range=(50, 101))
    assert not store.exists("seg/x.log")


def test_put_file_of_a_missing_file_is_a_store_error(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot read"):
        store.put_file("seg/x.log", tmp_path / "absent.log")


@pytest.mark.parametrize("key", ["", "a\x00b"])
def test_unusable_keys_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(StoreError, match="invalid object key"):
        store.put(key, b"x")


def test_store_pickles_without_its_client(store: ObjectStore) -> None:
    store.put("p", b"shipped to an executor")
    clone = pickle.loads(pickle.dumps(store))
    try:
        assert type(clone) is type(store)
        assert clone.get("p") == b"shipped to an executor"
    finally:
        clone.close()


# -- file store ------------------------------------------------------------------------------

HOSTILE_KEYS = [
    "../escape",
    "a/../../escape",
    "/etc/passwd",
    "a//b",
    "a/./b",
    "trailing/",
    "..",
    f"{LOCK_DIR}/000.lock",
    f"{ETAG_DIR}/k",
    f"x/.y{TMP_MARK}abc",
    "x" * 256,
]


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_file_store_refuses_hostile_keys(file_store: FileStore, key: str) -> None:
    outside = Path(file_store.root).parent
    before = sorted(p.name for p in outside.iterdir())
    for attempt in (
        lambda: file_store.put(key, b"x"),
        lambda: file_store.get(key),
        lambda: file_store.head(key),
        lambda: file_store.delete_many([key]),
    ):
        with pytest.raises(StoreError, match="invalid object key"):
            attempt()
    assert sorted(p.name for p in outside.iterdir()) == before
    assert list(file_store.list()) == []


@pytest.mark.parametrize("prefix", ["../", "a/../", "/a/", "a//", f"{LOCK_DIR}/", f"{ETAG_DIR}/",
                                    f"x/.y{TMP_MARK}/", "./a/"])
def test_file_store_lists_nothing_outside_its_keys_for_a_hostile_prefix(
        file_store: FileStore, prefix: str) -> None:
    """A prefix that could not name a key's directory is matched against the whole walk
    from the root, which never leaves the root nor shows the store's bookkeeping."""
    file_store.put("a/b", b"x")
    root = Path(file_store.root)
    (root.parent / "outside").mkdir(exist_ok=True)
    (root.parent / "outside" / "secret").write_bytes(b"s")
    assert list(file_store.list(prefix)) == []


def test_file_store_lists_a_deep_prefix_from_its_own_directory(
        file_store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition's listing reads that partition's directories, not every top-level one:
    under the hashed key prefixes there is one of those per partition (docs/format.md)."""
    import tiered.store.file as file_module

    for i in range(50):
        file_store.put(f"{i:08x}/kafka/t/{i}_r/0-9-1.log", b"x")
    scanned: list[str] = []
    real = os.scandir

    def scandir(path: Any) -> Any:
        scanned.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(file_module.os, "scandir", scandir)
    got = [i.key for i in file_store.list(f"{7:08x}/kafka/t/7_")]
    assert got == [f"{7:08x}/kafka/t/7_r/0-9-1.log"]
    root = os.path.join(file_store.root, f"{7:08x}", "kafka", "t")
    assert scanned and all(p == root or p.startswith(root + os.sep) for p in scanned)


def test_file_store_hides_its_bookkeeping_and_leaves_no_temp_files(file_store: FileStore) -> None:
    root = Path(file_store.root)
    e1 = file_store.put("t/1", b"a", if_none_match=True)
    file_store.put("t/1", b"b", if_match=e1)
    with pytest.raises(PreconditionFailed):
        file_store.put("t/1", b"c", if_none_match=True)
    (root / "t" / f".2{TMP_MARK}deadbeef").write_bytes(b"crash leftover")
    assert [i.key for i in file_store.list()] == ["t/1"]
    assert (root / LOCK_DIR).is_dir()
    leftovers = [p.name for p in root.rglob(f"*{TMP_MARK}*")]
    assert leftovers == [f".2{TMP_MARK}deadbeef"]  # only the planted one


def test_file_store_delete_prunes_empty_directories(file_store: FileStore) -> None:
    root = Path(file_store.root)
    file_store.put("x/y/z/1", b"1")
    file_store.put("x/keep", b"k")
    assert file_store.delete_many(["x/y/z/1"]) == []
    assert not (root / "x" / "y").exists()
    assert (root / "x" / "keep").is_file()
    assert not (root / ETAG_DIR / "x" / "y").exists()


def test_file_store_key_used_as_directory_is_a_clear_error(file_store: FileStore) -> None:
    file_store.put("a", b"object")
    with pytest.raises(StoreError, match="collides"):
        file_store.put("a/b", b"x")
    file_store.put("c/d", b"x")
    with pytest.raises(StoreError, match="collides"):
        file_store.put("c", b"x")


def test_file_store_etag_follows_a_file_replaced_behind_its_back(file_store: FileStore) -> None:
    old = file_store.put("k", b"original")
    path = Path(file_store.root) / "k"
    path.unlink()
    path.write_bytes(b"copied in by hand")  # new inode: the side file no longer describes it
    info = file_store.head("k")
    assert info.etag == hashlib.md5(b"copied in by hand").hexdigest()
    assert info.size == len(b"copied in by hand")
    with pytest.raises(PreconditionFailed):
        file_store.put("k", b"stale writer", if_match=old)
    file_store.put("k", b"current writer", if_match=info.etag)
    assert file_store.get("k") == b"current writer"


def test_file_store_survives_a_stale_side_file_in_the_way(file_store: FileStore) -> None:
    # a crash left a side file for `a` although object `a` is gone
    stale = Path(file_store.root) / ETAG_DIR / "a"
    stale.write_text("0123 1 2 3\n")
    file_store.put("a/b", b"nested")
    assert file_store.head("a/b").etag == hashlib.md5(b"nested").hexdigest()


def test_file_store_works_without_side_files(file_store: FileStore) -> None:
    file_store.put("k", b"content")
    for side in (Path(file_store.root) / ETAG_DIR).rglob("*"):
        if side.is_file():
            side.unlink()
    assert file_store.head("k").etag == hashlib.md5(b"content").hexdigest()
    assert [i.etag for i in file_store.list()] == [hashlib.md5(b"content").hexdigest()]


def _cas_increment_worker(url: str, key: str, times: int, barrier: Any, results: Any) -> None:
    """Read-modify-CAS `times` increments of a decimal counter; report conflicts seen."""
    store = FileStore(StoreSettings(url=url))
    conflicts = 0
    barrier.wait()
    for _ in range(times):
        while True:
            data = store.get(key)
            try:
                store.put(key, str(int(data) + 1).encode(), if_match=hashlib.md5(data).hexdigest())
            except PreconditionFailed:
                conflicts += 1
                continue
            break
    results.put(conflicts)


@pytest.mark.slow  # processes
def test_file_store_cas_holds_across_processes(file_store: FileStore) -> None:
    """Invariant 6: no update is ever lost, whichever process writes."""
    file_store.put("counter", b"0", if_none_match=True)
    procs_n, times = 4, 40
    ctx = multiprocessing.get_context("spawn")  # no fork of a process running server threads
    barrier = ctx.Barrier(procs_n)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_cas_increment_worker,
            args=(file_store.settings.url, "counter", times, barrier, results),
        )
        for _ in range(procs_n)
    ]
    for p in procs:
        p.start()
    # drain before join: a child exits only once its queued report is flushed
    lost_races = sum(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert int(file_store.get("counter")) == procs_n * times, f"{lost_races} CAS retries"


# -- S3 --------------------------------------------------------------------------------------


def test_s3_clients_share_one_parse_of_the_service_models(s3_store: S3Store) -> None:
    """Each store has a client and session of its own (sessions are not thread-safe), and
    they read S3's models through one loader: a Spark task's store does not parse them again.
    The clone, built as an executor builds it, still works."""
    clone = pickle.loads(pickle.dumps(s3_store))
    try:
        mine, theirs = s3_store._client, clone._client
        assert mine is not theirs
        assert mine.meta.service_model is not theirs.meta.service_model
        assert mine._loader is theirs._loader is tiered.store.s3._loader
        clone.put("shared-loader", b"x")
        assert s3_store.get("shared-loader") == b"x"
    finally:
        clone.close()


def test_warming_s3_models_never_stops_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark's worker daemon warms S3's models before it forks; an AWS configuration no client
    can be built from (a named profile that is not there) must not keep it from starting."""
    assert tiered.store.s3.warm_client_models()
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile-here")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    assert tiered.store.s3.warm_client_models() is False


def test_s3_multipart_etag_and_part_size(s3_store: S3Store, tmp_path: Path) -> None:
    src = tmp_path / "three-parts.log"
    src.write_bytes(os.urandom(2 * TEST_MULTIPART_THRESHOLD + 1))
    etag = s3_store.put_file("seg/mp.log", src)
    assert etag.endswith("-3")  # S3's multipart ETag: md5-of-md5s, dash, part count
    # the part size grows so that huge objects stay within S3's 10,000-part limit
    chunk = s3_store.settings.multipart_chunksize
    assert part_size(10, chunk) == TEST_MULTIPART_THRESHOLD
    assert part_size(10_000 * TEST_MULTIPART_THRESHOLD + 1, chunk) > TEST_MULTIPART_THRESHOLD


def test_s3_multipart_declares_a_checksum_the_store_keeps(s3_store: S3Store,
                                                          tmp_path: Path) -> None:
    # the upload names CRC-32C at creation and each part's CRC-32C (computed by tiered, not
    # botocore) goes with the part and into the completion, so the store checks every part
    # and keeps the object's composite checksum: the CRC-32C of the parts' CRC-32Cs
    src = tmp_path / "three-parts.log"
    data = os.urandom(2 * TEST_MULTIPART_THRESHOLD + 1)
    src.write_bytes(data)
    s3_store.put_file("seg/mp.log", src)
    got = s3_store._client.head_object(Bucket=s3_store.bucket, Key=s3_store.prefix + "seg/mp.log",
                                       ChecksumMode="ENABLED")
    size = TEST_MULTIPART_THRESHOLD
    parts = [data[i : i + size] for i in range(0, len(data), size)]
    digests = b"".join(crc32c.crc32c(p).to_bytes(4, "big") for p in parts)
    composite = base64.b64encode(crc32c.crc32c(digests).to_bytes(4, "big")).decode()
    if EXTERNAL_S3 and not got.get("ChecksumCRC32C"):
        pytest.skip("this server keeps no object checksum (Ceph RGW 16.2 predates flexible "
                    "checksums); the manifest's CRC-32C still checks every read")
    assert got.get("ChecksumCRC32C", "").split("-")[0] == composite
    assert s3_store.get("seg/mp.log") == data


def test_s3_parts_carry_tiered_crc32c_not_botocore_crc32(s3_store: S3Store,
                                                         tmp_path: Path) -> None:
    sent: dict[int, dict[str, Any]] = {}  # part number -> headers (parts go up concurrently)

    def record(request: Any, **_: Any) -> None:
        number = int(request.url.split("partNumber=")[1].split("&")[0])
        sent[number] = {k.lower(): v for k, v in request.headers.items()}

    s3_store._client.meta.events.register("before-send.s3.UploadPart", record)
    try:
        src = tmp_path / "two-parts.log"
        data = os.urandom(TEST_MULTIPART_THRESHOLD + 7)
        src.write_bytes(data)
        s3_store.put_file("seg/two.log", src)
    finally:
        s3_store._client.meta.events.unregister("before-send.s3.UploadPart", record)
    assert len(sent) == 2
    for headers, part in zip((sent[1], sent[2]), (data[:TEST_MULTIPART_THRESHOLD],
                                    data[TEST_MULTIPART_THRESHOLD:]), strict=True):
        want = base64.b64encode(crc32c.crc32c(part).to_bytes(4, "big"))
        assert headers["x-amz-checksum-crc32c"] in (want, want.decode())
        assert "x-amz-checksum-crc32" not in headers


def test_s3_single_puts_carry_crc32c_too(s3_store: S3Store, tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []
    s3_store._client.meta.events.register(
        "before-send.s3.PutObject",
        lambda request, **_: sent.append({k.lower(): v for k, v in request.headers.items()}))
    small = tmp_path / "small.index"
    small.write_bytes(b"index bytes")
    s3_store.put("m/manifest.json", b"{}", if_none_match=True)
    s3_store.put_file("seg/small.index", small)
    want = [base64.b64encode(crc32c.crc32c(b).to_bytes(4, "big")) for b in (b"{}", b"index bytes")]
    got = [h["x-amz-checksum-crc32c"] for h in sent]
    assert [g if isinstance(g, bytes) else g.encode() for g in got] == want
    assert all("x-amz-checksum-crc32" not in h for h in sent)


def test_file_range_crc32c_covers_its_window_and_leaves_the_position(tmp_path: Path) -> None:
    src = tmp_path / "f"
    data = os.urandom(3 * 1024 * 1024 + 5)  # more than one checksum block
    src.write_bytes(data)
    with src.open("rb") as f:
        body = FileRange(f.fileno(), 7, len(data) - 9, str(src))
        body.read(3)
        assert body.crc32c() == crc32c.crc32c(data[7:-2])
        assert body.tell() == 3
        short = FileRange(f.fileno(), len(data) - 4, 10, str(src))  # runs past the end
        with pytest.raises(StoreError, match="changed size"):
            short.crc32c()


def test_file_range_reads_its_window_only(tmp_path: Path) -> None:
    src = tmp_path / "f"
    src.write_bytes(bytes(range(100)))
    with src.open("rb") as f:
        body = FileRange(f.fileno(), 10, 20, str(src))
        assert len(body) == 20 and body.tell() == 0
        assert body.read(5) == bytes(range(10, 15))
        assert body.read() == bytes(range(15, 30))
        assert body.read() == b""
        assert body.seek(0, io.SEEK_END) == 20 and body.seek(-4, io.SEEK_CUR) == 16
        assert body.read(100) == bytes(range(26, 30))
        body.seek(0)
        buf = bytearray(8)
        assert body.readinto(buf) == 8 and bytes(buf) == bytes(range(10, 18))
        with pytest.raises(ValueError, match="whence"):
            body.seek(0, 7)


def test_s3_file_shrinking_mid_upload_fails_and_aborts(s3_store: S3Store,
                                                       tmp_path: Path) -> None:
    src = tmp_path / "three-parts.log"
    src.write_bytes(os.urandom(2 * TEST_MULTIPART_THRESHOLD + 1))
    s3_store._client.meta.events.register(  # cut the file as the first part goes out
        "before-call.s3.UploadPart", lambda **kwargs: os.truncate(src, 100))
    with pytest.raises(StoreError, match="changed size"):
        s3_store.put_file("seg/mp.log", src)
    uploads = s3_store._client.list_multipart_uploads(Bucket=s3_store.bucket)
    assert uploads.get("Uploads", []) == []
    assert not s3_store.exists("seg/mp.log")


def test_s3_multipart_refused_by_ready_is_aborted(s3_store: S3Store, tmp_path: Path) -> None:
    # ready() refused the object while its parts were going up: the upload is aborted, so no
    # parts stay behind to be billed
    src = tmp_path / "three-parts.log"
    src.write_bytes(os.urandom(2 * TEST_MULTIPART_THRESHOLD + 1))
    sent: list[str] = []
    s3_store._client.meta.events.register(
        "before-call.s3.UploadPart", lambda **kwargs: sent.append("part"))

    def refuse() -> None:
        raise Refused("verification failed")

    with pytest.raises(Refused):
        s3_store.put_file("seg/mp.log", src, ready=refuse)
    uploads = s3_store._client.list_multipart_uploads(Bucket=s3_store.bucket)
    assert uploads.get("Uploads", []) == []
    assert not s3_store.exists("seg/mp.log")


def test_s3_ready_runs_while_the_parts_go_up_and_its_refusal_stops_the_rest(
    s3_store: S3Store, tmp_path: Path
) -> None:
    # more parts than workers: the first ones are held in flight while ready() runs (so its
    # work, the archiver's index PUTs, is off the critical path), and when it refuses, the
    # parts not yet started are never sent
    parts = 6
    src = tmp_path / "six-parts.log"
    src.write_bytes(os.urandom((parts - 1) * TEST_MULTIPART_THRESHOLD + 1))
    held, release = threading.Semaphore(0), threading.Event()
    started: list[int] = []

    def hold(params: dict[str, Any], **_: Any) -> None:
        started.append(params["PartNumber"])
        held.release()
        assert release.wait(10)

    s3_store._client.meta.events.register("before-parameter-build.s3.UploadPart", hold)
    workers = min(s3_store.settings.multipart_concurrency, parts)  # an upload alone
    assert workers < parts

    def refuse() -> None:
        for _ in range(workers):  # every worker is inside a part, none has finished
            assert held.acquire(timeout=10), (workers, started)
        assert len(started) == workers
        release.set()
        raise Refused("verification failed")

    with pytest.raises(Refused):
        s3_store.put_file("seg/six.log", src, ready=refuse)
    assert sorted(started) == list(range(1, workers + 1))  # the rest were cancelled
    uploads = s3_store._client.list_multipart_uploads(Bucket=s3_store.bucket)
    assert uploads.get("Uploads", []) == []
    assert not s3_store.exists("seg/six.log")


def test_s3_prefix_isolates_stores(moto_endpoint: str, s3_bucket: str) -> None:
    under = S3Store(s3_settings(moto_endpoint, s3_bucket, prefix="cluster-a"), sleep=no_sleep)
    whole = S3Store(s3_settings(moto_endpoint, s3_bucket, prefix=""), sleep=no_sleep)
    try:
        under.put("k", b"a")
        whole.put("k", b"root")
        assert whole.get("cluster-a/k") == b"a"
        assert [i.key for i in under.list()] == ["k"]
        assert [i.key for i in whole.list()] == ["cluster-a/k", "k"]
        assert under.delete_many(["k"]) == []
        assert whole.get("k") == b"root"
    finally:
        under.close()
        whole.close()


def test_s3_standard_credential_chain(moto_endpoint: str, s3_bucket: str) -> None:
    # no explicit keys: boto3 finds the fake ones the moto fixture put in the environment
    settings = s3_settings(moto_endpoint, s3_bucket, access_key=None, secret_key=None)
    with S3Store(settings, sleep=no_sleep) as chained:
        chained.put("chain", b"ok")
        assert chained.get("chain") == b"ok"
