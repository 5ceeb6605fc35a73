"""The static-follower digest protocol behind its one setting (no broker)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from streams.quirks.static_followers import DIGEST_GRACE_S, StaticFollowers
from tests.unit.streams.fakes import FakeControl


@dataclass
class Member:
    static_id: str | None
    is_leader: bool = False
    received_digest: str | None = "d1"
    in_round: bool = False
    rejoins: list[str] = field(default_factory=list)

    def request_rejoin(self, reason: str, broadcast: bool = True, news: bool = True) -> None:
        self.rejoins.append(reason)


def test_a_follower_that_missed_its_assignment_rejoins() -> None:
    control = FakeControl()
    protocol = StaticFollowers(enabled=True, control=control)
    follower, leader = Member("a-thread-0"), Member("b-thread-0", is_leader=True)
    protocol.add_member(follower)
    protocol.add_member(leader)
    protocol.on_fetch_request({"a-thread-0": "d1", "b-thread-0": "other"})
    assert follower.rejoins == [] and leader.rejoins == []  # holds it; the leader never
    protocol.on_fetch_request({"a-thread-0": "d2"})
    assert follower.rejoins == ["missed the leader's last assignment"]


def test_a_follower_in_a_round_compares_the_leaders_digest_with_that_rounds_assignment(
) -> None:
    # Tansu answers the leader's SyncGroup first: the leader's digest of the round reached a
    # follower before the follower's own assignment, which asked for a round nobody needed.
    protocol = StaticFollowers(enabled=True, control=FakeControl())
    follower = Member("a-thread-0", in_round=True)
    protocol.add_member(follower)
    protocol.on_fetch_request({"a-thread-0": "d2"})
    assert follower.rejoins == []
    follower.in_round, follower.received_digest = False, "d2"
    protocol.assignment_applied(follower)
    assert follower.rejoins == []
    protocol.assignment_applied(follower)  # once per digest
    assert follower.rejoins == []


def test_a_digest_of_the_assignment_a_follower_holds_is_not_held_against_its_next_one(
) -> None:
    # The leader's answer (and so its digest) came after the follower had rejoined for the
    # next round: compared with that round's assignment it asked for a round nobody needed.
    protocol = StaticFollowers(enabled=True, control=FakeControl())
    follower = Member("a-thread-0", received_digest="d1", in_round=True)
    protocol.add_member(follower)
    protocol.on_fetch_request({"a-thread-0": "d1"})
    follower.in_round, follower.received_digest = False, "d2"
    protocol.assignment_applied(follower)
    assert follower.rejoins == []


def test_a_follower_the_round_left_out_rejoins_unless_a_newer_digest_comes_in_time() -> None:
    timers: list[tuple[float, Callable[[], None]]] = []
    protocol = StaticFollowers(enabled=True, control=FakeControl(),
                               schedule=lambda s, cb: timers.append((s, cb)))
    follower = Member("a-thread-0", in_round=True)
    protocol.add_member(follower)
    protocol.on_fetch_request({"a-thread-0": "d3"})
    follower.in_round, follower.received_digest = False, "d2"
    protocol.assignment_applied(follower)
    assert follower.rejoins == [] and [s for s, _ in timers] == [DIGEST_GRACE_S]
    timers.pop()[1]()
    assert follower.rejoins == ["missed the leader's last assignment"]
    # d3 may be of the round before the one whose assignment (d4) it just applied, and the
    # leader's digest of that round, on its way, says so.
    follower.rejoins.clear()
    follower.in_round = True
    protocol.on_fetch_request({"a-thread-0": "d3"})
    follower.in_round, follower.received_digest = False, "d4"
    protocol.assignment_applied(follower)
    protocol.on_fetch_request({"a-thread-0": "d4"})
    timers.pop()[1]()
    assert follower.rejoins == []


def test_the_leader_tells_its_followers_and_followers_ask_the_leader() -> None:
    control = FakeControl()
    protocol = StaticFollowers(enabled=True, control=control)
    leader, follower = Member("b-thread-0", is_leader=True), Member("a-thread-0")
    protocol.tell_followers(leader, {"a-thread-0": "x", "b-thread-0": "y"})
    assert control.fetch_requests == [{"a-thread-0": "x"}]
    protocol.tell_followers(follower, {"a-thread-0": "x"})  # only the leader tells
    assert len(control.fetch_requests) == 1
    protocol.ask_leader(follower, "learners ready")
    protocol.ask_leader(leader, "learners ready")
    assert control.rebalance_requests == ["a-thread-0: learners ready"]
    protocol.publish_subscription(follower, b"sub")
    protocol.on_subscription("a-thread-0", b"sub")
    assert control.subscriptions == ["a-thread-0"]
    assert protocol.fresh_subscription("a-thread-0") == b"sub"


def test_off_it_sends_nothing_and_ignores_what_it_reads() -> None:
    control = FakeControl()
    protocol = StaticFollowers(enabled=False, control=control)
    follower, leader = Member("a-thread-0"), Member("b-thread-0", is_leader=True)
    protocol.add_member(follower)
    protocol.ask_leader(follower, "r")
    protocol.tell_followers(leader, {"a-thread-0": "x"})
    protocol.publish_subscription(follower, b"s")
    protocol.on_subscription("a-thread-0", b"s")
    protocol.on_fetch_request({"a-thread-0": "d2"})
    assert control == FakeControl() and follower.rejoins == []
    assert protocol.fresh_subscription("a-thread-0") is None


def test_dynamic_members_take_no_part() -> None:
    control = FakeControl()
    protocol = StaticFollowers(enabled=True, control=control)
    protocol.ask_leader(Member(None), "r")
    protocol.publish_subscription(Member(None), b"s")
    assert control == FakeControl()



def test_a_restarted_static_instance_asks_the_leader_for_a_round_only_where_the_broker_needs_it(
) -> None:
    # Tansu hands a restarted static member its cached assignment and starts no round; the
    # new process, knowing none of it, waited for its join watch (about 16 s) before asking.
    control = FakeControl()
    StaticFollowers(enabled=True, control=control).restarted("w2 restarted")
    assert control.rebalance_requests == ["w2 restarted"]
    off = FakeControl()
    StaticFollowers(enabled=False, control=off).restarted("w2 restarted")
    assert off.rebalance_requests == []


def test_a_restart_after_a_crash_looks_again_at_its_old_status_without_waiting_it_out() -> None:
    from streams.app import DUPLICATE_RECHECK_MIN_S, duplicate_recheck_wait_s

    # A record written 4 s ago comes from a dead process: one short look again suffices.
    assert duplicate_recheck_wait_s(10_000, 14_000, 3.0) == DUPLICATE_RECHECK_MIN_S
    # A fresh record may come from a live duplicate: wait until it would have been renewed.
    assert duplicate_recheck_wait_s(10_000, 10_500, 3.0) == 2.5
    # A clock ahead of ours never shortens the wait below a publication and a margin.
    assert duplicate_recheck_wait_s(20_000, 10_000, 3.0) == 3.0


def test_a_restart_after_a_crash_on_this_state_directory_needs_no_second_look() -> None:
    from streams.app import written_by_the_dead
    from streams.group.predecessors import MemberRecord

    # The crashed process ran here: its file lock was free, and its records are on this
    # machine's clock. Still the newest 2 s on, nobody else has been publishing the key.
    dead = [MemberRecord("w2-thread-0-abc", "w2-thread-0", 4242)]
    record = {"member_id": "w2-thread-0-abc", "pid": 4242, "updated_ms": 10_000}
    assert written_by_the_dead({"w2-thread-0": record}, dead, 12_000)
    # Too fresh: a live duplicate may not have published since.
    assert not written_by_the_dead({"w2-thread-0": record}, dead, 10_500)
    # Another process's record (a live duplicate elsewhere, whatever its clock says).
    other = {**record, "pid": 777, "updated_ms": 0}
    assert not written_by_the_dead({"w2-thread-0": other}, dead, 12_000)
    # No predecessor here (a first start, or the state directory is new): the second look.
    assert not written_by_the_dead({"w2-thread-0": record}, [], 12_000)
