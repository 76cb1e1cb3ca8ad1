"""Upload leases against a real store (a directory, and moto's S3 over HTTP), driven tick by
tick on a fake clock. Design invariant 10: one uploader per partition, and a holder that lost
its lease can never commit again; invariant 6: the lease generation is the writer term."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from archiver import assignment
from archiver.lease_keeper import LeaseKeeper
from manifests import edits
from manifests.commit import ManifestStore
from manifests.errors import StaleTerm
from manifests.lease_objects import PartitionId, read_lease, read_node_record
from tiered.store.base import ObjectStore

LEASE_MS = 3000
PARTS = [PartitionId("orders", p, "rev") for p in range(6)]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def wall(self) -> float:
        return 1.7e9 + self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make(store: ObjectStore, clock: Clock) -> Iterator[Callable[..., LeaseKeeper]]:
    made: list[LeaseKeeper] = []

    def factory(node: str, parts: Iterable[PartitionId] = PARTS, hw: int = 1000,
                **kw: object) -> LeaseKeeper:
        keeper = LeaseKeeper(store, ManifestStore(store), node, LEASE_MS, clock=clock,
                             wall=clock.wall, **kw)  # type: ignore[arg-type]
        keeper.publish({p: hw for p in parts})
        made.append(keeper)
        return keeper

    yield factory


def settle(clock: Clock, keepers: list[LeaseKeeper], rounds: int = 30) -> None:
    """Tick every keeper, a poll interval apart, until nothing changes for three rounds."""
    quiet, last = 0, None
    for _ in range(rounds):
        for k in keepers:
            k.tick()
        now = [sorted(k.holdings()) for k in keepers]
        quiet = quiet + 1 if now == last else 0
        if quiet >= 3:
            return
        last = now
        clock.t += LEASE_MS / 6000
    raise AssertionError(f"leases did not settle: {last}")


def holders(store: ObjectStore) -> dict[PartitionId, str | None]:
    out = {}
    for p in PARTS:
        lease, _ = read_lease(store, p)
        out[p] = None if lease is None else lease.holder
    return out


def assert_one_holder_each(store: ObjectStore, keepers: list[LeaseKeeper]) -> None:
    """Every partition is held by exactly the keeper its lease object names."""
    stored = holders(store)
    for p in PARTS:
        claiming = [k.node for k in keepers if k.role(p).uploader]
        assert claiming == [stored[p]], (p, claiming, stored[p])


def test_three_nodes_share_the_partitions_evenly(store: ObjectStore, clock: Clock,
                                                 make: Callable[..., LeaseKeeper]) -> None:
    keepers = [make("a"), make("b"), make("c")]
    settle(clock, keepers)
    assert sorted(len(k.holdings()) for k in keepers) == [2, 2, 2]
    assert_one_holder_each(store, keepers)
    # each holder writes as its lease's generation, committed as the head manifest's term
    # when anyone held the lease before (a first holder has nobody to fence)
    mstore = ManifestStore(store)
    for k in keepers:
        for p, generation in k.holdings().items():
            assert k.role(p).term == generation
            head, etag = mstore.load(p.topic, p.partition, p.revision)
            assert head.term == generation or (generation == 1 and etag is None)


def test_two_nodes_racing_for_new_partitions_get_one_holder_each(
        store: ObjectStore, clock: Clock, make: Callable[..., LeaseKeeper]) -> None:
    """Two nodes that have not seen each other tick at the same moment over partitions no
    one advertises and with no head: both create the leases blind (If-None-Match), and
    each partition ends with exactly the one holder its lease object names."""
    for attempt in range(5):
        parts = [PartitionId("orders", p, f"race{attempt}") for p in range(6)]
        keepers = [make(f"a{attempt}", parts), make(f"b{attempt}", parts)]
        start = threading.Barrier(2)

        def tick(keeper: LeaseKeeper, start: threading.Barrier = start) -> None:
            start.wait(10)
            keeper.tick()

        racers = [threading.Thread(target=tick, args=(k,)) for k in keepers]
        for t in racers:
            t.start()
        for t in racers:
            t.join(60)
        for p in parts:
            lease, _ = read_lease(store, p)
            claiming = [k.node for k in keepers if k.role(p).uploader]
            assert lease is not None and claiming == [lease.holder], (p, claiming, lease)
        for k in keepers:
            k.stop(release=True)


def test_a_joining_node_picks_partitions_up_without_a_storm(
        store: ObjectStore, clock: Clock, make: Callable[..., LeaseKeeper]) -> None:
    parts = [PartitionId("orders", p, "rev") for p in range(24)]
    a, b = make("a", parts), make("b", parts)
    settle(clock, [a, b])
    assert sorted(len(k.holdings()) for k in (a, b)) == [12, 12]
    c = make("c", parts)
    released_per_tick = []
    for _ in range(40):
        for k in (a, b, c):
            before = k.stats().released_total
            k.tick()
            released_per_tick.append(k.stats().released_total - before)
        clock.t += LEASE_MS / 6000
        if len(c.holdings()) == 8:
            break
    assert sorted(len(k.holdings()) for k in (a, b, c)) == [8, 8, 8]
    # no node hands over more than a quarter of a share (8) per tick
    assert max(released_per_tick) == 2


def test_a_holder_that_stops_renewing_is_taken_over_and_fenced(
        store: ObjectStore, clock: Clock, make: Callable[..., LeaseKeeper]) -> None:
    a, b = make("a"), make("b")
    settle(clock, [a, b])
    theirs = sorted(a.holdings())
    old = a.holdings()[theirs[0]]
    mstore = ManifestStore(store)
    # a paused holder: no ticks for longer than the lease
    for _ in range(30):
        clock.t += LEASE_MS / 6000
        b.tick()
        if len(b.holdings()) == len(PARTS):
            break
    assert len(b.holdings()) == len(PARTS)
    assert b.stats().taken_over_total == len(theirs)
    taken = b.holdings()[theirs[0]]
    assert taken > old
    # a's lease lapsed on its own clock: it uploads nothing any more
    assert not any(a.role(p).uploader for p in PARTS)
    # and a commit it had in flight as its old term is refused
    p = theirs[0]
    with pytest.raises(StaleTerm):
        mstore.update(p.topic, p.partition, p.revision, lambda m: edits.with_term(m, old))
    # when it wakes it finds the leases gone, then gets its share back by handover
    a.tick()
    assert a.stats().lost_total == len(theirs)
    settle(clock, [a, b])
    assert sorted(len(k.holdings()) for k in (a, b)) == [3, 3]
    assert_one_holder_each(store, [a, b])


def test_a_clean_stop_releases_so_the_others_take_over_at_once(
        store: ObjectStore, clock: Clock, make: Callable[..., LeaseKeeper]) -> None:
    a, b = make("a"), make("b")
    settle(clock, [a, b])
    mine = sorted(a.holdings())
    assert mine
    before = a.stats().requests_total
    a.stop(release=True)
    # one request however many leases it held: deleting its record releases them all
    assert a.stats().requests_total - before == 1
    assert read_node_record(store, "a") is None
    assert not any(a.role(p).uploader for p in PARTS)
    b.tick()  # no lease time to wait: b's listing shows a gone
    assert len(b.holdings()) == len(PARTS)
    assert b.stats().taken_over_total == len(mine)
    assert all(holders(store)[p] == "b" for p in PARTS)
    # and what a held is fenced: a commit as a's old generation is refused
    mstore = ManifestStore(store)
    p = mine[0]
    with pytest.raises(StaleTerm):
        mstore.update(p.topic, p.partition, p.revision, lambda m: edits.with_term(m, 1))


def test_a_node_restarting_after_a_clean_stop_keeps_its_leases_and_generations(
        store: ObjectStore, clock: Clock, make: Callable[..., LeaseKeeper]) -> None:
    a = make("a")
    settle(clock, [a])
    held = a.holdings()
    a.stop(release=True)
    again = make("a")
    again.tick()
    assert again.holdings() == held  # the same generations: nothing to fence, no new term


def test_a_holder_whose_replica_falls_behind_hands_over(
        store: ObjectStore, clock: Clock, make: Callable[..., LeaseKeeper]) -> None:
    a, b = make("a", hw=100), make("b", hw=100)
    settle(clock, [a, b])
    mine = sorted(a.holdings())
    released = a.stats().released_total
    # b's replica moves on; a's stays at 100 for longer than a lease
    for i in range(40):
        b.publish({p: 100 + 10 * (i + 1) for p in PARTS})
        a.publish({p: 100 for p in PARTS})
        for k in (a, b):
            k.tick()
        clock.t += LEASE_MS / 6000
        if not a.holdings():
            break
    assert not a.holdings() and len(b.holdings()) == len(PARTS)
    assert a.stats().released_total - released == len(mine)  # handed over, not taken


def test_an_unchanged_tick_skips_the_assignment_and_a_changed_record_does_not(
        store: ObjectStore, clock: Clock, make: Callable[..., LeaseKeeper],
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = make("a"), make("b")
    settle(clock, [a, b])
    # past a lease time of watching, the records' high watermarks of a lease ago are known
    for _ in range(12):
        for k in (a, b):
            k.tick()
        clock.t += LEASE_MS / 6000
    held = (a.holdings(), b.holdings())
    calls: list[int] = []
    real = assignment.assign

    def counted(members: Any) -> dict[PartitionId, str]:
        calls.append(len(members))
        return real(members)

    monkeypatch.setattr(assignment, "assign", counted)
    # two lease times of ticks: both renew and re-read each other's record, nothing changed
    for _ in range(12):
        for k in (a, b):
            k.tick()
        clock.t += LEASE_MS / 6000
    assert calls == []
    assert (a.holdings(), b.holdings()) == held
    # b's replicas move on: once a has read b's renewed record, it plans again
    b.publish({p: 2000 for p in PARTS})
    for _ in range(12):
        b.tick()
        calls.clear()
        a.tick()
        if calls:
            break
        clock.t += LEASE_MS / 6000
    assert calls == [2]
    assert (a.holdings(), b.holdings()) == held


def test_a_one_shot_beside_its_daemon_works_under_the_daemons_leases(
        store: ObjectStore, clock: Clock, make: Callable[..., LeaseKeeper]) -> None:
    daemon, other = make("n1"), make("n2")
    settle(clock, [daemon, other])
    once = make("n1", passive=True)
    once.tick()
    assert once.holdings() == daemon.holdings()
    for p, generation in daemon.holdings().items():
        assert once.role(p).uploader and once.role(p).term == generation
    for p in other.holdings():
        assert not once.role(p).uploader
    # it left the node's record to the daemon
    record = read_node_record(store, "n1")
    assert record is not None and not record[0].passive


def test_a_one_shot_alone_takes_every_partition_and_keeps_them_for_its_node(
        store: ObjectStore, clock: Clock, make: Callable[..., LeaseKeeper]) -> None:
    once = make("n1", passive=True)
    once.tick()
    assert set(once.holdings()) == set(PARTS)
    once.stop(release=False)
    assert not any(once.role(p).uploader for p in PARTS)
    # the node's next run (or its daemon) goes on under the same leases, no new generation
    again = make("n1", passive=True)
    again.tick()
    assert again.holdings() == once.holdings()


def test_a_one_shot_takes_nothing_a_running_daemon_holds(
        store: ObjectStore, clock: Clock, make: Callable[..., LeaseKeeper]) -> None:
    daemon = make("n1")
    settle(clock, [daemon])
    once = make("n2", passive=True)
    once.tick()
    assert once.holdings() == {}
    assert all(not once.role(p).uploader and once.role(p).holder == "n1" for p in PARTS)


def test_two_processes_of_one_node_share_its_leases(
        store: ObjectStore, clock: Clock, make: Callable[..., LeaseKeeper]) -> None:
    first, second = make("n1"), make("n1")
    settle(clock, [first, second])
    assert first.holdings() == second.holdings() and set(first.holdings()) == set(PARTS)



def test_a_holder_that_cannot_list_keeps_its_leases_while_it_can_renew(
        proxied_s3_store: Callable[..., ObjectStore], fault_proxy: Any, clock: Clock) -> None:
    store = proxied_s3_store()
    keeper = LeaseKeeper(store, ManifestStore(store), "a", LEASE_MS, clock=clock,
                         wall=clock.wall)
    keeper.publish({p: 1000 for p in PARTS})
    keeper.tick()
    assert set(keeper.holdings()) == set(PARTS)
    # every listing of the node records fails from now on; renewals (PUTs) still work
    fault_proxy.inject("internal", times=10_000, method="GET", query_contains="prefix=")
    for _ in range(4 * 6):  # four lease times
        clock.t += LEASE_MS / 6000
        keeper.tick()
        assert all(keeper.role(p).uploader for p in PARTS)
    assert keeper.stats().renew_failures_total == 0
    # and when renewals fail too, it stands by a lease time less a renewal after the last one
    fault_proxy.inject("internal", times=10_000, method="PUT")
    lapse_at = clock.t + (LEASE_MS - LEASE_MS / 3) / 1000
    while clock.t < lapse_at + LEASE_MS / 1000:
        clock.t += LEASE_MS / 6000
        keeper.tick()
        if clock.t >= lapse_at:
            assert not any(keeper.role(p).uploader for p in PARTS)
    assert keeper.stats().renew_failures_total > 0


def test_a_damaged_record_of_another_node_does_not_stop_this_one(
        store: ObjectStore, clock: Clock, make: Callable[..., LeaseKeeper]) -> None:
    store.put("_tiered/nodes/broken.json", b"{not json")
    a = make("a")
    settle(clock, [a])
    assert set(a.holdings()) == set(PARTS)


def test_a_damaged_lease_object_is_replaced_when_the_partition_is_taken(
        store: ObjectStore, clock: Clock, make: Callable[..., LeaseKeeper]) -> None:
    store.put(PARTS[0].lease_key, b'{"version":1,"kind":"lease"}')
    a = make("a")
    settle(clock, [a])
    assert set(a.holdings()) == set(PARTS)
    lease, _ = read_lease(store, PARTS[0])
    assert lease is not None and lease.holder == "a"


def test_each_lease_gained_is_logged_with_its_generation_without_a_map_of_all(
        store: ObjectStore, clock: Clock, make: Callable[..., LeaseKeeper],
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Taking a lease logs its generation, read for that lease alone: a map of every lease
    held, built once per lease taken, made a start at thousands of partitions quadratic."""
    a = make("a")
    monkeypatch.setattr(a, "holdings", lambda: pytest.fail("holdings() built per lease"))
    with caplog.at_level("INFO", logger="archiver.lease_keeper"):
        a.tick()
    gained = [m for m in (r.getMessage() for r in caplog.records)
              if "acquired the upload lease" in m]
    assert len(gained) == len(PARTS)
    assert all(m.endswith("(generation 1)") for m in gained)


def test_acquisitions_use_most_of_the_store_s_connection_pool(tmp_path: Any,
                                                               clock: Clock) -> None:
    """At start each acquisition is requests in series, so the time to take thousands of
    partitions is the store's latency times partitions over the acquisitions in flight: they
    follow `cloud_storage_max_connections` (32 in flight with a pool of 40; 16 with 20)."""
    from tiered.store import FileStore, StoreSettings

    store = FileStore(StoreSettings(url=f"file://{tmp_path}/bucket", max_connections=40))
    together = threading.Barrier(32, timeout=10)
    get = store.get

    def meeting_get(key: str, byte_range: Any = None) -> Any:
        if key.endswith("/manifest.json"):  # every acquisition's head read, side by side
            together.wait()
        return get(key, byte_range)

    store.get = meeting_get  # type: ignore[method-assign]
    parts = [PartitionId("orders", p, "rev") for p in range(32)]
    keeper = LeaseKeeper(store, ManifestStore(store), "n1", LEASE_MS, clock=clock,
                         wall=clock.wall)
    keeper.publish({p: 1000 for p in parts})
    keeper.tick()
    assert not together.broken
    assert sorted(keeper.holdings()) == sorted(parts)
    keeper.stop(release=True)
    store.close()
