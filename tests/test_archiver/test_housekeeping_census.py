"""The census's matching of one bucket listing against what each partition's last full
housekeeping judged: pure, fed listed objects."""

from __future__ import annotations

from archiver.housekeeping_census import Census, shards
from manifests import keys
from manifests.collect import listing_fingerprint, unjudged_keys
from manifests.lease_objects import PartitionId
from tiered.store.base import ObjectInfo

A = PartitionId("orders", 0, "r1")
B = PartitionId("orders", 1, "r1")


def info(key: str, etag: str = "e") -> ObjectInfo:
    return ObjectInfo(key=key, size=1, etag=etag, last_modified=0.0)


def objects(pid: PartitionId, head_etag: str = "h1") -> list[ObjectInfo]:
    """A partition's objects as a listing shows them: a segment and its bundle, an archived
    manifest, the head, its copies and the lease."""
    data = keys.partition_data_prefix(*pid)
    head = keys.partition_manifest_key(*pid)
    return sorted([
        info(data + "0-9-1.log", "s"), info(data + "0-9-1.indexes", "i"),
        info(keys.archived_manifest_key(*pid, 0, 9, 0, 0, 1, 1), "a"),
        info(head, head_etag), *(info(k, "c") for k in keys.head_copy_keys(head)),
        info(keys.partition_lease_key(*pid), "l"),
    ], key=lambda i: i.key)


def judged(pid: PartitionId, listing: list[ObjectInfo], head_etag: str = "h1"
           ) -> tuple[str, bytes]:
    """What a full pass that listed `listing` records: its head's ETag, and the fingerprint
    of the rest, as `collect_orphans` computes it."""
    left_out = unjudged_keys(*pid)
    return head_etag, listing_fingerprint((i.key, i.etag) for i in listing
                                          if i.key not in left_out)


def census_of(judgements: dict[PartitionId, tuple[str, bytes]], listing: list[ObjectInfo],
              max_foreign: int = 1000) -> Census:
    census = Census(judgements, max_foreign=max_foreign)
    for i in sorted(listing, key=lambda i: i.key):
        if not census.feed(i):
            break
    return census


def test_a_partition_listed_as_its_full_pass_left_it_is_unchanged() -> None:
    listing = objects(A) + objects(B)
    census = census_of({A: judged(A, objects(A)), B: judged(B, objects(B))},
                       [*listing, info("_tiered/nodes/n1.json"), info("other/key")])
    assert sorted(census.unchanged()) == [A, B]
    assert census.objects == len(listing) + 2


def test_the_head_s_copies_and_the_lease_may_be_rewritten() -> None:
    """Each commit rewrites a copy and a lease change the lease; neither is ever collected."""
    moved = [info(i.key, "new") if ".copy-" in i.key or i.key.endswith(keys.LEASE_NAME)
             else i for i in objects(A)]
    assert census_of({A: judged(A, objects(A))}, moved).unchanged() == [A]


def test_any_other_difference_sends_the_partition_to_its_full_pass() -> None:
    base = objects(A)
    data = keys.partition_data_prefix(*A)
    changes = {
        "an object added": [*base, info(data + "10-19-0.log")],
        "an object removed": [i for i in base if not i.key.endswith(".indexes")],
        "an object rewritten": [info(i.key, "x") if i.key.endswith(".log") else i for i in base],
        "the head changed": objects(A, head_etag="h2"),
        "the head lost": [i for i in base if not i.key.endswith(keys.PARTITION_MANIFEST_NAME)],
    }
    for what, listing in changes.items():
        assert census_of({A: judged(A, base)}, listing).unchanged() == [], what


def test_a_partition_sharing_the_hash_prefix_is_told_apart_by_its_own_prefixes() -> None:
    """Two partitions may share `{h}/`: only the objects under a candidate's own data and
    meta prefixes count for it."""
    h = keys.partition_prefix(*A)
    neighbour = [info(h + "kafka/payments/0_r1/0-9-1.log"),
                 info(h + "meta/kafka/payments/0_r1/manifest.json")]
    assert census_of({A: judged(A, objects(A))}, objects(A) + neighbour).unchanged() == [A]


def test_a_census_gives_up_past_its_limit_of_other_partitions_objects() -> None:
    """Its candidates' own objects cost a full pass as much; the others are what a census
    costs beyond: past the limit it gives up."""
    others = objects(B)
    census = census_of({A: judged(A, objects(A))}, objects(A) + others,
                       max_foreign=len(others))
    assert not census.gave_up and census.unchanged() == [A]
    assert census.foreign == len(others) and census.objects == len(objects(A)) + len(others)
    census = census_of({A: judged(A, objects(A))}, objects(A) + others,
                       max_foreign=len(others) - 1)
    assert census.gave_up and census.unchanged() == []


def test_the_listing_is_cut_by_the_first_digit_of_the_hash_prefixes() -> None:
    """Each piece is the census of the candidates under one first hex digit."""
    pids = [PartitionId("orders", p, "r1") for p in range(40)]
    pieces = shards({pid: judged(pid, objects(pid)) for pid in pids})
    assert sorted(pieces) == sorted({keys.partition_prefix(*pid)[0] for pid in pids})
    for digit, census in pieces.items():
        assert all(keys.partition_prefix(*pid).startswith(digit) for pid in census.judged)
        assert census.max_foreign == 3000 * len(census.judged)
    assert sum(len(c.judged) for c in pieces.values()) == len(pids)


def test_a_listing_out_of_key_order_spares_nothing() -> None:
    """The fingerprint is built as the listing goes, in key order: a store that lists out of
    order cannot match it, and its partitions keep their full passes."""
    census = Census({A: judged(A, objects(A))}, max_foreign=1000)
    for i in reversed(objects(A)):
        census.feed(i)
    assert census.unchanged() == []
