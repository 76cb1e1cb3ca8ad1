"""Who uploads which partition (archiver.assignment): pure, no I/O. Design invariant 10 (one
uploader per partition) rests on the leases; this policy only has to spread them evenly,
move few of them, and never leave a partition without a willing holder."""

from __future__ import annotations

import random
from collections import Counter

from archiver.assignment import Member, assign, behind, current_holders, plan_moves
from manifests.lease_objects import PartitionId, ReplicaState

PARTS = [PartitionId("orders", p, "rev") for p in range(24)]


def _replicas(parts: list[PartitionId] = PARTS, hw: int = 1000, ago: int = -1
              ) -> dict[PartitionId, ReplicaState]:
    return {p: ReplicaState(hw, ago) for p in parts}


def _member(node: str, holding: list[PartitionId] = (), **kw: object) -> Member:  # type: ignore[assignment]
    replicas = kw.pop("replicas", None) or _replicas()
    return Member(node, replicas, {p: 1 for p in holding}, **kw)  # type: ignore[arg-type]


def test_three_nodes_with_every_replica_take_a_third_each() -> None:
    desired = assign([_member("a"), _member("b"), _member("c")])
    assert set(desired) == set(PARTS)
    assert sorted(Counter(desired.values()).values()) == [8, 8, 8]


def test_the_answer_does_not_depend_on_the_order_of_the_records() -> None:
    members = [_member("a", PARTS[:5]), _member("b", PARTS[5:7]), _member("c")]
    first = assign(members)
    for seed in range(5):
        shuffled = members[:]
        random.Random(seed).shuffle(shuffled)
        assert assign(shuffled) == first


def test_holders_keep_their_partitions_up_to_their_share() -> None:
    # a and b hold twelve each; c joins: each keeps eight, c gets the other eight
    a, b = _member("a", PARTS[:12]), _member("b", PARTS[12:])
    desired = assign([a, b, _member("c")])
    assert sum(1 for p in PARTS[:12] if desired[p] == "a") == 8
    assert sum(1 for p in PARTS[12:] if desired[p] == "b") == 8
    assert Counter(desired.values())["c"] == 8
    # nothing moves between a and b
    assert not any(desired[p] == "b" for p in PARTS[:12])


def test_a_partition_goes_only_to_nodes_with_a_replica_of_it() -> None:
    only_c = PartitionId("rare", 0, "rev")
    c = _member("c", replicas={**_replicas(), only_c: ReplicaState(5)})
    desired = assign([_member("a"), _member("b"), c])
    assert desired[only_c] == "c"


def test_a_holder_whose_replica_is_behind_loses_the_partition() -> None:
    p = PARTS[0]
    stuck = _member("a", [p], replicas={p: ReplicaState(100, 100)})
    ahead = _member("b", replicas={p: ReplicaState(900, 500)})
    assert behind("a", p, [stuck, ahead])
    assert assign([stuck, ahead])[p] == "b"


def test_plain_follower_lag_is_not_behind() -> None:
    # the follower is below the leader now, but past where the leader was a lease time ago
    p = PARTS[0]
    follower = _member("a", [p], replicas={p: ReplicaState(990, 500)})
    leader = _member("b", replicas={p: ReplicaState(1000, 700)})
    assert not behind("a", p, [follower, leader])
    assert assign([follower, leader])[p] == "a"


def test_unknown_history_never_counts_as_ahead() -> None:
    p = PARTS[0]
    new = _member("b", replicas={p: ReplicaState(10_000, -1)})
    holder = _member("a", [p], replicas={p: ReplicaState(10, -1)})
    assert assign([holder, new])[p] == "a"


def test_passive_members_are_given_nothing() -> None:
    desired = assign([_member("a"), _member("once", passive=True)])
    assert set(desired.values()) == {"a"}


def test_current_holder_is_the_higher_generation_when_two_advertise() -> None:
    p = PARTS[0]
    old = Member("a", _replicas(), {p: 3})
    new = Member("b", _replicas(), {p: 4})
    assert current_holders([old, new])[p] == "b"


def test_a_joining_node_gets_partitions_a_few_at_a_time() -> None:
    a, b, c = _member("a", PARTS[:12]), _member("b", PARTS[12:]), _member("c")
    moves = plan_moves("a", [a, b, c], set(PARTS[:12]), max_releases=2)
    assert len(moves.release) == 2 and {to for _, to in moves.release} == {"c"}
    assert moves.acquire == ()
    # c acquires only what nobody holds yet: nothing until a and b release
    assert plan_moves("c", [a, b, c], set()).acquire == ()
    freed = _member("a", PARTS[2:12])
    acquire = plan_moves("c", [freed, b, c], set()).acquire
    assert set(acquire) <= {PARTS[0], PARTS[1]} and acquire


def test_a_node_acquires_its_share_of_free_partitions_and_nothing_held() -> None:
    a, b = _member("a"), _member("b", PARTS[:3])
    moves = plan_moves("a", [a, b], set())
    desired = assign([a, b])
    assert set(moves.acquire) == {p for p, n in desired.items() if n == "a"}
    assert not set(moves.acquire) & set(PARTS[:3])


def test_orphaned_partitions_are_taken_by_any_candidate() -> None:
    a, b = _member("a"), _member("b")
    desired = assign([a, b])
    theirs = sorted(p for p, n in desired.items() if n == "b")
    moves = plan_moves("a", [a, b], set(), orphaned={theirs[0]})
    assert theirs[0] in moves.acquire
    assert theirs[1] not in moves.acquire


def test_a_passive_node_takes_only_what_no_active_node_has_a_replica_of() -> None:
    solo = PartitionId("solo", 0, "rev")
    once = _member("once", passive=True, replicas={**_replicas(), solo: ReplicaState(1)})
    moves = plan_moves("once", [_member("a"), once], set(), passive=True)
    assert moves.acquire == (solo,)
    assert moves.release == ()
    # alone, it takes everything it has
    assert set(plan_moves("once", [once], set(), passive=True).acquire) == {*PARTS, solo}
