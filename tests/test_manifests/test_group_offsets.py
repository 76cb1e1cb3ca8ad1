"""Committed consumer-group offsets in the bucket: keys every sidecar derives alike from the
group id (hostile ids included), a strict JSON format, and commits that are compare-and-swap
so concurrent committers for one group all land (on every store backend)."""

from __future__ import annotations

import threading

import pytest

from manifests import keys
from manifests.errors import CorruptManifest, InvalidName, UnsupportedManifestVersion
from manifests.group_offsets import (
    CommittedOffset,
    GroupOffsets,
    commit_group_offsets,
    decode_group_offsets,
    encode_group_offsets,
    load_group_offsets,
)
from tiered.store.base import ObjectStore


@pytest.mark.parametrize(("group", "component"), [
    ("orders-app", "orders-app"),
    ("a b/c", "a%20b%2Fc"),
    (".", "%2E"),
    ("..", "%2E%2E"),
    ("é", "%C3%A9"),
])
def test_group_keys_are_one_safe_component(group: str, component: str) -> None:
    key = keys.group_offsets_key(group)
    assert key.startswith(keys.GROUPS_PREFIX) and key.endswith(f"/{component}/offsets.json")
    assert len(key.split("/")) == 5  # no slash of the id survives
    assert keys.group_offsets_key(group) == key  # deterministic across processes


@pytest.mark.parametrize("group", ["", "x" * 201, 7, "\ud800"])
def test_group_ids_no_key_can_hold_are_refused(group: object) -> None:
    with pytest.raises(InvalidName):
        keys.group_key_component(group)


def test_round_trip_is_sorted_and_exact() -> None:
    g = GroupOffsets("g", {("b", 1): CommittedOffset(7, 3, None, 1_700_000_000_000),
                           ("a", 0): CommittedOffset(42)})
    data = encode_group_offsets(g)
    assert data.startswith(
        b'{"version":1,"kind":"group_offsets","group":"g","offsets":[{"topic":"a"')
    assert decode_group_offsets(data) == g
    assert list(decode_group_offsets(data).offsets) == [("a", 0), ("b", 1)]


@pytest.mark.parametrize("doc", [
    b'{"version":1,"kind":"group_offsets","group":"g"}',
    b'{"version":1,"kind":"group_offsets","group":"g","offsets":[{"topic":"t"}]}',
    b'{"version":1,"kind":"group_offsets","group":"g","offsets":[{"topic":"../x","partition":0,'
    b'"offset":1,"leader_epoch":-1,"metadata":"","commit_timestamp":0}]}',
    b'{"version":1,"kind":"group_offsets","group":"g","offsets":[{"topic":"t","partition":0,'
    b'"offset":1.5,"leader_epoch":-1,"metadata":"","commit_timestamp":0}]}',
    b'{"version":1,"kind":"partition","group":"g","offsets":[]}',
    b"not json",
])
def test_malformed_objects_are_corrupt(doc: bytes) -> None:
    with pytest.raises(CorruptManifest):
        decode_group_offsets(doc, key="k")


def test_a_newer_format_is_refused() -> None:
    with pytest.raises(UnsupportedManifestVersion):
        decode_group_offsets(b'{"version":2,"kind":"group_offsets","group":"g","offsets":[]}')


def test_commits_merge_and_read_back(store: ObjectStore) -> None:
    assert load_group_offsets(store, "g") == (GroupOffsets("g"), None)
    commit_group_offsets(store, "g", {("t", 0): CommittedOffset(5), ("t", 1): CommittedOffset(9)})
    commit_group_offsets(store, "g", {("t", 0): CommittedOffset(6, metadata="m")})
    got, etag = load_group_offsets(store, "g")
    assert etag is not None
    assert dict(got.offsets) == {("t", 0): CommittedOffset(6, metadata="m"),
                                 ("t", 1): CommittedOffset(9)}
    assert load_group_offsets(store, "other")[1] is None  # groups do not share objects


def test_concurrent_committers_all_land(store: ObjectStore) -> None:
    """Design invariant 6 for offsets: eight committers racing on one group's object, each
    for its own partition; compare-and-swap re-applies a loser's commit, none is lost."""
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def commit(p: int) -> None:
        try:
            barrier.wait()
            commit_group_offsets(store, "race", {("t", p): CommittedOffset(p * 10)})
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=(p,)) for p in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    got, _ = load_group_offsets(store, "race")
    assert {p: c.offset for (_t, p), c in got.offsets.items()} == {p: p * 10 for p in range(8)}
