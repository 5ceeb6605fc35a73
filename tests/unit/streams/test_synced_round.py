"""A member asks for the next round only once its whole round has its assignments: the pure
decision, the reports a process keeps, the control topic's encoding, and the thread that waits
(fake clients, no broker)."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from streams.group.control import ROUND_KEY, decode_round_report, encode_round_report
from streams.group.group_learning import GroupLearning
from streams.group.join_watch import LOST_SYNC_AFTER_S
from streams.quirks import hooks
from streams.quirks.synced_round import (
    KEEP_MEMBERS,
    SYNC_WAIT_LIMIT_S,
    UNKNOWN_ROUND_WAIT_S,
    RoundReports,
    RoundView,
    may_ask_after_others_synced,
    may_join_after_loss,
    may_rejoin,
    members_synced,
    rejoin_limit_s,
    sync_answer_lost,
)
from streams.runtime.factory import ThreadClients, build_stream_thread
from tests.conftest import wait_until
from tests.unit.streams.fakes import (
    SOURCE,
    FakeChangelogReader,
    FakeConsumer,
    FakeControl,
    FakeProducer,
    Rig,
    assign,
    config,
    counting_subs,
    embedded_hooks,
    rig,
)


def view(generation: int = 4, size: int = 3, rebalancing: bool = False,
         waited_s: float = 0.0) -> RoundView:
    return RoundView(generation, size, rebalancing, waited_s)


def test_a_member_waits_until_every_member_of_its_generation_has_its_assignment() -> None:
    reports = {"a": 4, "b": 3, "c": 4}  # b still waits for its SyncGroup answer
    assert members_synced(4, reports) == 2
    assert not may_rejoin(view(), reports)
    reports["b"] = 4
    assert may_rejoin(view(), reports)


def test_members_of_other_generations_do_not_count() -> None:
    # Gone members of older rounds, and a member already in a newer round (this member's
    # generation is stale: a round is under way), are not members of this round.
    reports = {"a": 4, "b": 4, "gone": 2, "ahead": 5}
    assert members_synced(4, reports) == 2
    assert not may_rejoin(view(size=3), reports)


def test_the_wait_is_bounded() -> None:
    reports = {"a": 4}
    assert not may_rejoin(view(waited_s=SYNC_WAIT_LIMIT_S - 0.1), reports)
    assert may_rejoin(view(waited_s=SYNC_WAIT_LIMIT_S), reports)
    assert may_rejoin(view(waited_s=1.0), reports, limit_s=1.0)


def test_never_in_the_middle_of_a_round() -> None:
    # A request made during a round is answered right after this member's own SyncGroup:
    # the race itself. Even once the wait's limit has passed.
    reports = {"a": 4, "b": 4, "c": 4}
    assert not may_rejoin(view(rebalancing=True), reports)
    assert not may_rejoin(view(rebalancing=True, waited_s=60.0), reports)


def test_a_member_that_does_not_know_its_round_asks_at_once() -> None:
    assert may_rejoin(view(generation=-1), {})  # no assignment yet
    assert may_rejoin(view(size=0), {})  # an older leader did not say the round's size


def test_reports_keep_each_members_latest_generation() -> None:
    reports = RoundReports()
    reports.record("a", 3)
    reports.record("a", 4)
    reports.record("b", 4)
    reports.record("", 4)  # not a member yet
    reports.record("c", -1)  # no generation yet
    assert reports.generations == {"a": 4, "b": 4}
    # A group that starts over counts from the beginning again: the latest report wins.
    reports.record("a", 0)
    assert reports.generations["a"] == 0


def test_reports_forget_the_members_gone_longest() -> None:
    reports = RoundReports()
    for n in range(KEEP_MEMBERS + 5):
        reports.record(f"m{n}", 1)
    reports.record("m0", 2)  # reported again: kept as the newest
    assert len(reports.generations) == KEEP_MEMBERS
    assert "m0" in reports.generations and "m1" not in reports.generations


def test_round_reports_round_trip_and_malformed_ones_are_refused() -> None:
    assert decode_round_report(encode_round_report("member-1", 7)) == ("member-1", 7)
    with pytest.raises(ValueError, match="malformed round report"):
        decode_round_report(b"\x92\x01\xa1x")  # [1, "x"]
    with pytest.raises(ValueError, match="malformed round report"):
        decode_round_report(b"not msgpack at all \xc1")


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each answer of the member's round waiter when it looks at the reports, in order: a
    test waits for the waiter's next looks instead of sleeping through them."""
    answers: list[bool] = []

    def looked(*args: Any, **kwargs: Any) -> bool:
        answers.append(may_rejoin(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(hooks, "may_rejoin", looked)
    return answers


async def looked_again(looks: list[bool], times: int = 2) -> None:
    """Wait until the waiter looked ``times`` more times: the last saw what the test did."""
    seen = len(looks)
    await wait_until(lambda: len(looks) >= seen + times, timeout_s=5,
                     message=f"{times} more looks at the round's reports")


def reporting_rig(state_dir: Path, reports: RoundReports, member_id: str,
                  **settings: object) -> Rig:
    consumer = FakeConsumer()
    consumer.member_id, consumer.generation = member_id, 4
    producer = FakeProducer()
    clients = ThreadClients(consumer, producer, FakeChangelogReader(),
                            FakeChangelogReader(), data_producer=producer)
    control = FakeControl()
    thread = build_stream_thread(config(state_dir, **settings), 0, counting_subs(),
                                 clients=clients,
                                 instance_id="unit-instance", control=control,
                                 hooks=embedded_hooks(round_reports=reports))
    return Rig(thread, consumer, clients.producer, clients.restorer,  # type: ignore[arg-type]
               clients.follower, control)


async def test_a_member_reports_its_round_once_it_applied_its_assignment(tmp_path: Path) -> None:
    r = reporting_rig(tmp_path, RoundReports(), "member-a")
    try:
        await assign(r, ("0_0",), group_size=2)
        await wait_until(lambda: bool(r.producer.to("unit-control")), timeout_s=5)
        sent = r.producer.to("unit-control")
        assert [(s.key, decode_round_report(s.value)) for s in sent] == [  # type: ignore[arg-type]
            (ROUND_KEY, ("member-a", 4))]
    finally:
        r.thread.task_manager.close_all()


async def test_the_follow_up_rebalance_waits_for_the_rounds_assignments(
        tmp_path: Path, looks: list[bool]) -> None:
    reports = RoundReports()
    r = reporting_rig(tmp_path, reports, "member-a")
    try:
        reports.record("member-a", 4)
        # It revoked 0_1: the assignor asks it to rejoin at once for the follow-up round.
        await assign(r, ("0_0",), revoked=("0_1",), rejoin_after_ms=0, group_size=3)
        await looked_again(looks)
        assert r.consumer.rejoins == 0  # b and c still wait for their SyncGroup answers
        reports.record("member-b", 4)
        reports.record("member-c", 3)  # c's report of the round before does not count
        await looked_again(looks)
        assert r.consumer.rejoins == 0 and not any(looks)
        reports.record("member-c", 4)
        await wait_until(lambda: r.consumer.rejoins == 1, timeout_s=5)
    finally:
        r.thread.task_manager.close_all()


async def test_ready_learners_ask_once_synced_and_requests_made_meanwhile_ask_once(
        tmp_path: Path, looks: list[bool]) -> None:
    reports = RoundReports()
    r = reporting_rig(tmp_path, reports, "member-a")
    try:
        await assign(r, (), learners=("0_2",), group_size=2)
        reports.record("member-a", 4)
        r.thread.member.learners_ready(["0_2"])
        r.thread.member.request_rejoin_once_synced("follow-up rebalance")
        await looked_again(looks)
        assert r.consumer.rejoins == 0
        # The next round began meanwhile (someone else asked): no request in its middle.
        r.consumer.rebalancing = True
        reports.record("member-b", 4)
        await looked_again(looks)
        assert r.consumer.rejoins == 0 and not looks[-1]
        # The round ends with generation 5: the wait starts over for its members.
        r.consumer.rebalancing, r.consumer.generation = False, 5
        await assign(r, (), learners=("0_2",), group_size=2)
        reports.record("member-a", 5)
        await looked_again(looks)
        assert r.consumer.rejoins == 0
        reports.record("member-b", 5)
        await wait_until(lambda: r.consumer.rejoins == 1, timeout_s=5)
        # Both reasons, one request: the waiter said yes once and stopped looking.
        assert looks.count(True) == 1 and looks[-1]
        assert not r.thread.member.asking  # the waiter is done: no second request comes
        assert r.consumer.rejoins == 1
    finally:
        r.thread.task_manager.close_all()


async def test_without_reports_a_member_asks_at_once(tmp_path: Path) -> None:
    r = rig(tmp_path)
    try:
        await assign(r, (), learners=("0_2",), group_size=2)
        r.thread.member.learners_ready(["0_2"])
        assert r.consumer.rejoins == 1
        await asyncio.sleep(0)  # a report the assignment scheduled would be sent by now
        assert not r.producer.to("unit-control")  # and reports nothing
    finally:
        r.thread.task_manager.close_all()


async def test_a_stopping_member_leaves_once_its_round_has_its_assignments(
        tmp_path: Path, looks: list[bool]) -> None:
    # A dynamic member's consumer sends LeaveGroup when it stops: that starts a round too.
    reports = RoundReports()
    r = reporting_rig(tmp_path, reports, "member-a")
    stopped: list[float] = []

    async def stop() -> None:
        stopped.append(1.0)

    r.consumer.stop = stop  # type: ignore[method-assign]
    run = asyncio.create_task(r.thread.run([SOURCE]))
    await assign(r, ("0_0",), group_size=2)
    reports.record("member-a", 4)
    r.thread.stop()
    await looked_again(looks)
    assert not stopped and not run.done()  # member-b still waits for its SyncGroup answer
    reports.record("member-b", 4)
    await asyncio.wait_for(run, 10)
    assert stopped


async def test_a_stopping_member_waits_for_the_others_at_most_the_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The wait's clock moves 50 ms each time it is read: the limit passes without sleeping.
    ticks = itertools.count()
    monkeypatch.setattr(hooks, "time", SimpleNamespace(monotonic=lambda: next(ticks) * 0.05))
    reports = RoundReports()
    r = reporting_rig(tmp_path, reports, "member-a")
    r.thread.task_manager.close_all()
    await assign(r, (), group_size=2)
    reports.record("member-a", 4)
    # member-b never reports (it crashed, say): the wait ends anyway, at the limit.
    synced = await asyncio.wait_for(
        r.thread.hooks.until_others_synced(r.thread.member, limit_s=0.3), 5)
    assert synced is False
    reports.record("member-b", 4)
    assert await r.thread.hooks.until_others_synced(r.thread.member, limit_s=0.3) is True


async def test_a_stop_the_world_member_neither_reports_nor_waits(tmp_path: Path) -> None:
    r = reporting_rig(tmp_path, RoundReports(), "member-a", rebalance_protocol="eager")
    try:
        await assign(r, (), group_size=3)
        r.thread.member.request_rejoin_once_synced("follow-up rebalance")
        assert r.consumer.rejoins == 1
        await asyncio.sleep(0)  # a report the assignment scheduled would be sent by now
        assert not r.producer.to("unit-control")
    finally:
        r.thread.task_manager.close_all()


def test_a_sync_answer_is_lost_only_when_another_member_reports_the_generation_joined(
) -> None:
    reports = {"me": 3, "b": 4}
    # Joined generation 4 (JoinGroup answered), applied 3, b has its assignment of 4: lost.
    assert sync_answer_lost("me", 4, 3, True, reports)
    assert sync_answer_lost("me", 4, 3, True, {"b": 5})
    # Still joining (the generation is the one it applied), or not in a round: not lost.
    assert not sync_answer_lost("me", 3, 3, True, reports)
    assert not sync_answer_lost("me", 4, 3, False, reports)
    # Nobody else has generation 4 yet; its own report does not count.
    assert not sync_answer_lost("me", 4, 3, True, {"b": 3, "me": 4})
    assert not sync_answer_lost("me", -1, -1, True, {"b": 0})


async def test_a_member_whose_sync_answer_was_lost_asks_the_leader_once_per_generation(
        tmp_path: Path) -> None:
    reports = RoundReports()
    r = reporting_rig(tmp_path, reports, "member-a")
    watch = r.thread.join_watch
    try:
        await assign(r, ("0_0",), group_size=2)
        control = r.control
        # The next round: its JoinGroup was answered (generation 5), no SyncGroup answer yet.
        r.consumer.rebalancing, r.consumer.generation = True, 5
        r.consumer.pending_sync = 5  # its SyncGroup still waits for the answer
        now = 1_000.0
        assert not watch.check_lost_sync(now)
        reports.record("member-b", 5)  # b has its assignment of generation 5
        assert not watch.check_lost_sync(now + 1)
        assert not watch.check_lost_sync(now + 1 + LOST_SYNC_AFTER_S - 0.5)
        assert watch.check_lost_sync(now + 1 + LOST_SYNC_AFTER_S)
        assert control.rebalance_requests == [
            "thread 0: SyncGroup answer of generation 5 lost"]
        # It gives its own SyncGroup up too, to join the round it asks for with the others.
        assert r.consumer.abandoned_syncs == [5]
        # Once per generation; the stall remedy stays the fallback.
        assert not watch.check_lost_sync(now + 100)
        r.consumer.generation = 6
        reports.record("member-b", 6)
        assert not watch.check_lost_sync(now + 101)
        assert watch.check_lost_sync(now + 101 + LOST_SYNC_AFTER_S)
        # Answered at last: nothing more.
        r.consumer.rebalancing = False
        assert not watch.check_lost_sync(now + 200)
    finally:
        r.thread.task_manager.close_all()


def test_a_member_whose_membership_ended_joins_once_the_others_round_ended() -> None:
    limit = rejoin_limit_s(10_000)
    assert limit == pytest.approx(9.0)  # half a session, a static SyncGroup's 3 s, and 1 s
    assert not may_join_after_loss(["b-thread-0"], 2.0, limit)
    assert may_join_after_loss([], 0.0, limit)
    assert may_join_after_loss(["b-thread-0"], limit, limit)  # bounded
    # Nothing fresh known of the others yet: it waits for their records, a moment at most.
    assert not may_join_after_loss(None, 0.5, limit)
    assert may_join_after_loss(None, UNKNOWN_ROUND_WAIT_S, limit)


async def test_the_wait_after_a_loss_follows_the_others_round_and_only_with_the_quirk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "ROUND_CHECK_INTERVAL_S", 0.0)
    in_round = [["b-thread-0"], ["b-thread-0"], []]
    looks: list[int] = []

    def others() -> list[str]:
        looks.append(1)
        return in_round.pop(0) if in_round else []

    await hooks.RoundHooks(round_reports=RoundReports()).until_others_out_of_round(others, 5.0)
    assert len(looks) == 3
    looks.clear()
    await hooks.RoundHooks().until_others_out_of_round(lambda: ["b-thread-0"], 5.0)  # quirk off
    await hooks.RoundHooks(round_reports=RoundReports()).until_others_out_of_round(
        lambda: ["b-thread-0"], 0.0)  # bounded


async def test_a_member_s_status_says_it_is_in_a_round_from_its_join_to_its_assignment(
        tmp_path: Path) -> None:
    r = rig(tmp_path)
    try:
        await assign(r, ("0_0",))
        reporter = r.thread.reporter
        assert reporter.status_record()["in_round"] is False
        await r.thread.listener.before_join()
        assert reporter.status_record()["in_round"] is True
        await assign(r, ("0_0",))
        assert reporter.status_record()["in_round"] is False
    finally:
        r.thread.task_manager.close_all()


async def test_the_wait_starts_over_when_a_round_ends_in_the_same_generation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Tansu keeps a generation over several rounds: a member whose wait had passed its limit
    during a round asked at once as it ended, and its JoinGroup made the syncs of that round's
    other members vain (a soak's moved task then waited two rounds more)."""
    ticks = itertools.count()
    monkeypatch.setattr(hooks, "time", SimpleNamespace(monotonic=lambda: float(next(ticks))))
    monkeypatch.setattr(hooks, "ROUND_CHECK_INTERVAL_S", 0.0)
    views: list[RoundView] = []

    class Member:
        generation = 4

        def round_view(self, waited_s: float) -> RoundView:
            # In a round for the first ten looks (past the 5-s limit), then out of it.
            view = RoundView(4, 2, len(views) < 10, waited_s)
            views.append(view)
            return view

    reports = RoundReports()
    reports.record("member-a", 4)  # member-b never reports its assignment
    round_hooks = hooks.RoundHooks(round_reports=reports)
    view = await round_hooks.until_round_synced(Member(), asyncio.Event())  # type: ignore[arg-type]
    assert view is not None and not view.rebalancing
    after_round = [v for v in views if not v.rebalancing]
    # Counted from the round's end, the wait ran its limit again before it gave up.
    assert len(after_round) > SYNC_WAIT_LIMIT_S and view.waited_s >= SYNC_WAIT_LIMIT_S


def test_a_member_asks_once_no_member_of_another_instance_is_in_a_round() -> None:
    assert not may_ask_after_others_synced(["w3-thread-0"], 1.0)
    assert may_ask_after_others_synced([], 0.0)
    assert may_ask_after_others_synced(["w3-thread-0"], SYNC_WAIT_LIMIT_S)  # bounded
    assert may_ask_after_others_synced(None, 0.0)  # nothing fresh known: as without records


async def test_the_wait_before_asking_ends_once_the_member_is_in_a_round_itself(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "ROUND_CHECK_INTERVAL_S", 0.0)
    looks: list[int] = []

    def in_round() -> bool:
        looks.append(1)
        return len(looks) > 3

    round_hooks = hooks.RoundHooks(round_reports=RoundReports())
    await round_hooks.until_before_asking(lambda: ["w3-thread-0"], in_round, limit_s=1e9)
    assert len(looks) >= 4
    await hooks.RoundHooks().until_before_asking(lambda: ["w3-thread-0"], lambda: False)  # off


async def test_the_follow_up_waits_for_a_member_whose_generation_report_is_of_the_round_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tansu keeps a generation over rounds: w3, restarted, joined the round that handed it a
    task and waited for its SyncGroup answer while its report of the round before had the
    same generation; the leader, which had revoked a task in that round, asked for the
    follow-up at once, made w3's answer vain (given only at Tansu's timeout, 8 s later), and
    the task stalled 21.9 s in a static soak. Its status said it was in a round."""
    monkeypatch.setattr(hooks, "ROUND_CHECK_INTERVAL_S", 0.0)
    answers: list[bool] = []

    def looked(*args: Any, **kwargs: Any) -> bool:
        answers.append(may_ask_after_others_synced(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(hooks, "may_ask_after_others_synced", looked)
    now_ms = int(time.time() * 1000)
    learning = GroupLearning()
    learning.start_following = lambda: None
    status = {"generation": 4, "acceptable_lag": 10, "learning": {}}
    learning.apply("w3-thread-0", {**status, "updated_ms": now_ms, "in_round": True}, now_ms)
    reports = RoundReports()
    r = rig(tmp_path, round_reports=reports, group_learning=learning)
    try:
        r.consumer.member_id, r.consumer.generation = "unit-instance-thread-0", 4
        for member in ("unit-instance-thread-0", "w3-thread-0"):
            reports.record(member, 4)  # w3's report is of the round before
        await assign(r, ("0_0",), revoked=("0_1",), rejoin_after_ms=0, group_size=2)
        await wait_until(lambda: len(answers) >= 3, timeout_s=5)
        assert r.consumer.rejoins == 0 and not any(answers)  # w3 still waits for its answer
        learning.apply("w3-thread-0", {**status, "updated_ms": now_ms, "in_round": False},
                       now_ms)
        await wait_until(lambda: r.consumer.rejoins == 1, timeout_s=5)
    finally:
        r.thread.task_manager.close_all()
