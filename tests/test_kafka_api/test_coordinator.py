"""The consumer-group state machine alone, time passed in: joins complete when every member
has (re)joined or at the deadline, the leader gets the member list and hands out assignments,
heartbeats tell members to rejoin, silent members and unused member ids expire, commits are
checked against the member and generation, as Kafka's group coordinator does."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from tiered.app.kafka_api.coordinator import (
    Groups,
    GroupSettings,
    GroupState,
    JoinRequest,
)

G = "group"
RANGE = ("range", b"meta-range")
ROUNDROBIN = ("roundrobin", b"meta-rr")


def _req(member: str = "", *, protocols: tuple[tuple[str, bytes], ...] = (RANGE,),
         session: float = 10.0, rebalance: float = 30.0, known: bool = False,
         ptype: str = "consumer") -> JoinRequest:
    return JoinRequest(G, member, "client", "127.0.0.1", session, rebalance, ptype, protocols,
                       require_known_member=known)


def _groups(delay: float = 0.0) -> Groups:
    return Groups(GroupSettings(initial_delay_s=delay, min_session_timeout_s=1.0,
                                max_session_timeout_s=60.0))


def _stable_pair(g: Groups) -> tuple[str, str]:
    """Two members in a STABLE group of generation 2: returns (leader, follower)."""
    a, res = g.join(_req(), 0.0)
    assert res is not None and res.generation == 1 and res.leader == a
    assert g.sync(G, a, 1, [(a, b"A")], 0.0).assignment == b"A"
    b, res = g.join(_req(), 1.0)
    assert res is None  # the leader must rejoin first
    assert g.heartbeat(G, a, 1, 1.5) == ErrorCode.rebalance_in_progress
    _a, res_a = g.join(_req(a), 2.0)
    res_b = g.join_result(G, b)
    assert res_a is not None and res_b is not None
    assert res_a.generation == res_b.generation == 2 and res_a.leader == a
    assert {m for m, _ in res_a.members} == {a, b} and res_b.members == ()
    assert g.sync(G, b, 2, [], 2.1) is None  # waits for the leader's assignments
    assert g.sync(G, a, 2, [(a, b"A2"), (b, b"B2")], 2.2).assignment == b"A2"
    assert g.sync_result(G, b, 2).assignment == b"B2"
    assert g.state(G) is GroupState.STABLE
    return a, b


def test_a_lone_member_joins_and_syncs_at_once() -> None:
    g = _groups()
    member, res = g.join(_req(), 0.0)
    assert res is not None and res.error == ErrorCode.none
    assert (res.generation, res.protocol_type, res.protocol_name) == (1, "consumer", "range")
    assert res.members == ((member, b"meta-range"),)
    assert g.state(G) is GroupState.COMPLETING_REBALANCE
    assert g.heartbeat(G, member, 1, 0.1) == ErrorCode.none
    assert g.sync(G, member, 1, [(member, b"x")], 0.2).assignment == b"x"
    assert g.state(G) is GroupState.STABLE


def test_a_second_member_rebalances_the_group() -> None:
    _stable_pair(_groups())


def test_join_v4_hands_out_a_member_id_first() -> None:
    g = _groups()
    member, res = g.join(_req(known=True), 0.0)
    assert res is not None and res.error == ErrorCode.member_id_required and member
    _same, res = g.join(_req(member, known=True), 0.1)
    assert res is not None and res.error == ErrorCode.none and res.member_id == member
    assert g.join(_req("stranger", known=True), 0.2)[1].error == ErrorCode.unknown_member_id


def test_an_unused_member_id_lapses() -> None:
    g = _groups()
    member, _ = g.join(_req(known=True, session=5.0), 0.0)
    assert g.tick(6.0)
    assert g.join(_req(member, known=True), 6.1)[1].error == ErrorCode.unknown_member_id


def test_the_initial_delay_gathers_members_starting_together() -> None:
    g = _groups(delay=3.0)
    a, res = g.join(_req(), 0.0)
    assert res is None and not g.tick(1.0)
    b, res = g.join(_req(), 2.0)  # extends the wait by the delay, up to the rebalance timeout
    assert res is None and not g.tick(4.0)
    assert g.tick(5.0)
    res_a, res_b = g.join_result(G, a), g.join_result(G, b)
    assert res_a is not None and res_b is not None and res_a.generation == 1
    assert len(res_a.members) == 2


def test_members_that_do_not_rejoin_are_dropped_at_the_deadline() -> None:
    g = _groups()
    a, b = _stable_pair(g)
    c, res = g.join(_req(rebalance=5.0), 10.0)
    assert res is None
    g.join(_req(a), 11.0)  # a rejoins; b keeps heartbeating but never rejoins
    for t in (12.0, 20.0, 28.0, 36.0):
        assert g.heartbeat(G, b, 2, t) == ErrorCode.rebalance_in_progress
        g.heartbeat(G, a, 2, t)
        assert not g.tick(t + 0.5)
    assert g.tick(40.5)  # 10 s + the largest rebalance timeout, 30 s
    assert set(g.members(G)) == {a, c} and g.generation(G) == 3
    assert g.join_result(G, b).error == ErrorCode.unknown_member_id
    assert g.join_result(G, c).generation == 3


def test_silent_members_expire_and_the_rest_rebalance() -> None:
    g = _groups()
    a, b = _stable_pair(g)
    g.heartbeat(G, a, 2, 9.0)
    assert g.tick(12.5)  # b's last sign of life was at 2.2, its session is 10 s
    assert g.members(G) == [a] and g.state(G) is GroupState.PREPARING_REBALANCE
    assert g.heartbeat(G, a, 2, 12.6) == ErrorCode.rebalance_in_progress
    assert g.heartbeat(G, b, 2, 12.6) == ErrorCode.unknown_member_id
    _a, res = g.join(_req(a), 13.0)
    assert res is not None and res.generation == 3


def test_leaving_empties_the_group_and_bumps_the_generation() -> None:
    g = _groups()
    a, b = _stable_pair(g)
    assert g.leave(G, b, 3.0) == ErrorCode.none
    assert g.state(G) is GroupState.PREPARING_REBALANCE
    assert g.leave(G, a, 3.1) == ErrorCode.none
    assert g.state(G) is GroupState.EMPTY and g.generation(G) == 3
    assert g.leave(G, a, 3.2) == ErrorCode.unknown_member_id


def test_a_follower_rejoining_unchanged_gets_the_current_generation() -> None:
    g = _groups()
    _a, b = _stable_pair(g)
    _b, res = g.join(_req(b), 3.0)
    assert res is not None and res.generation == 2 and g.state(G) is GroupState.STABLE


@pytest.mark.parametrize(("req", "error"), [
    (_req(session=0.5), ErrorCode.invalid_session_timeout),
    (_req(session=120.0), ErrorCode.invalid_session_timeout),
    (_req(protocols=()), ErrorCode.inconsistent_group_protocol),
])
def test_bad_joins_are_refused(req: JoinRequest, error: ErrorCode) -> None:
    assert _groups().join(req, 0.0)[1].error == error


def test_protocols_must_fit_the_group() -> None:
    g = _groups()
    g.join(_req(protocols=(RANGE,)), 0.0)
    assert g.join(_req(protocols=(ROUNDROBIN,)), 0.1)[1].error == (
        ErrorCode.inconsistent_group_protocol)
    assert g.join(_req(ptype="connect"), 0.1)[1].error == ErrorCode.inconsistent_group_protocol


def test_the_protocol_most_members_prefer_wins() -> None:
    g = _groups(delay=1.0)
    a, _ = g.join(_req(protocols=(ROUNDROBIN, RANGE)), 0.0)
    g.join(_req(protocols=(RANGE, ROUNDROBIN)), 0.1)
    g.join(_req(protocols=(ROUNDROBIN, RANGE)), 0.2)
    g.tick(2.0)
    res = g.join_result(G, a)
    assert res is not None and res.protocol_name == "roundrobin"
    assert all(meta == b"meta-rr" for _m, meta in res.members)


def test_commit_checks() -> None:
    g = _groups()
    # a consumer that assigns partitions itself commits with no member while the group is empty
    assert g.check_commit(G, "", -1, 0.0) == ErrorCode.none
    a, b = _stable_pair(g)
    assert g.check_commit(G, "", -1, 3.0) == ErrorCode.unknown_member_id
    assert g.check_commit(G, a, 1, 3.0) == ErrorCode.illegal_generation
    assert g.check_commit(G, a, 2, 3.0) == ErrorCode.none
    g.join(_req(), 4.0)  # a third member: the group prepares a rebalance
    assert g.check_commit(G, b, 2, 4.1) == ErrorCode.none  # still generation 2's to commit
    assert g.sync(G, a, 2, [], 4.2).error == ErrorCode.rebalance_in_progress


def test_next_deadline_tracks_sessions_and_rebalances() -> None:
    g = _groups(delay=3.0)
    assert g.next_deadline() is None
    g.join(_req(session=10.0), 0.0)
    assert g.next_deadline() == 3.0  # the initial delay ends first


def test_describe_shows_members_their_subscription_and_assignment() -> None:
    groups = Groups(GroupSettings(initial_delay_s=0.0, min_session_timeout_s=1.0))
    req = JoinRequest("g", "", "client-a", "10.0.0.1", 10.0, 10.0, "consumer",
                      (("range", b"sub-range"), ("roundrobin", b"sub-rr")))
    member_id, joined = groups.join(req, 0.0)
    assert joined is not None and joined.error is ErrorCode.none
    before = groups.describe("g")
    assert before is not None and before.state is GroupState.COMPLETING_REBALANCE
    assert [m.assignment for m in before.members] == [b""]  # not handed out yet
    assert groups.sync("g", member_id, joined.generation, [(member_id, b"mine")], 0.1)
    after = groups.describe("g")
    assert after is not None
    assert (after.state, after.protocol_type, after.protocol_name) == (
        GroupState.STABLE, "consumer", "range")
    assert [(m.member_id, m.client_id, m.client_host, m.metadata, m.assignment)
            for m in after.members] == [(member_id, "client-a", "10.0.0.1", b"sub-range",
                                         b"mine")]
    assert groups.describe("other") is None and groups.group_ids() == ["g"]


def test_only_an_empty_group_is_forgotten() -> None:
    groups = Groups(GroupSettings(initial_delay_s=0.0, min_session_timeout_s=1.0))
    member_id, _ = groups.join(JoinRequest("g", "", "c", "h", 10.0, 10.0, "consumer",
                                           (("range", b""),)), 0.0)
    assert not groups.forget("g")  # a member is in it
    assert groups.leave("g", member_id, 1.0) is ErrorCode.none
    assert groups.forget("g") and groups.describe("g") is None
    assert not groups.forget("g")
