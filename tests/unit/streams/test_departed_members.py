"""Departed static members the broker still keeps: which ones a joining member removes (only
those silent for longer than a session timeout), and when it looks for them (joining for
longer than a round, then every few seconds, one look at a time)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from streams.group import join_watch
from streams.group.group_learning import GroupLearning, past_session
from streams.group.join_watch import DEPARTED_CHECK_EVERY_S, JoinWatch
from streams.group.member_id import static_id_of, thread_id_in
from streams.group.round_alarm import RoundAlarm
from streams.kafka.membership import GroupMember
from streams.quirks.departed_members import (
    EXPIRY_GRACE_MS,
    departed_static_members,
    removable_after_ms,
)
from streams.runtime.factory import silences_of
from tests.conftest import wait_until
from tests.unit.streams.fakes import rig

UUID = "c28e295f-8ef0-400d-8381-3d8009bcf105"
NOW = 1_000_000


def member(static: str) -> GroupMember:
    return GroupMember(f"{static}-{UUID}", f"app-{static}", "/127.0.0.1")


def test_static_ids_are_read_from_member_ids() -> None:
    assert static_id_of(f"node-a-thread-0-{UUID}") == "node-a-thread-0"
    assert static_id_of(f"app-0-{UUID}") is None          # a dynamic member
    assert static_id_of("node-a-thread-0") is None


def test_only_members_silent_for_longer_than_a_session_timeout_are_departed() -> None:
    members = [member(s) for s in ("stale-thread-0", "fresh-thread-0", "stopped-thread-0",
                                   "just-stopped-thread-0", "unknown-thread-0", "me-thread-0")]
    statuses = {"stale-thread-0": {"updated_ms": NOW - 31_000},
                "fresh-thread-0": {"updated_ms": NOW - 2_000},
                "me-thread-0": {"updated_ms": NOW - 99_000}}
    departures = {"stopped-thread-0": NOW - 30_001, "just-stopped-thread-0": NOW - 5_000}
    gone = departed_static_members(members, statuses, departures, NOW, 30_000, "me-thread-0")
    assert gone == [(f"stale-thread-0-{UUID}", "stale-thread-0"),
                    (f"stopped-thread-0-{UUID}", "stopped-thread-0")]


def test_a_leader_just_past_its_session_is_left_to_the_broker_s_own_expiry() -> None:
    """Removed by LeaveGroup while it led a round being formed, a frozen leader kept the
    leadership on Tansu, and the others waited for it to come back; the broker's own expiry
    ends it. So a member whose status says it led waits a grace past the session; a follower
    goes at once (the broker may keep a frozen one past its session)."""
    assert removable_after_ms(10_000, leader=True) == 10_000 + EXPIRY_GRACE_MS
    assert removable_after_ms(10_000, leader=False) == 10_000
    assert EXPIRY_GRACE_MS >= 1_000  # a status interval: the last heartbeat may come later
    frozen = [member("w3-thread-0")]
    for leader, silent_ms, removed in ((True, 10_070, False),
                                       (True, 10_000 + EXPIRY_GRACE_MS, False),
                                       (True, 10_001 + EXPIRY_GRACE_MS, True),
                                       (False, 10_070, True)):
        statuses = {"w3-thread-0": {"updated_ms": NOW - silent_ms, "leader": leader}}
        gone = departed_static_members(frozen, statuses, {}, NOW, 10_000, "w1-thread-0")
        assert bool(gone) is removed, (leader, silent_ms)


@pytest.mark.asyncio
async def test_a_member_joining_for_longer_than_a_round_looks_for_departed_members(
    tmp_path: Path,
) -> None:
    r = rig(tmp_path, session_timeout_ms=12_000, heartbeat_interval_ms=1_000)
    looks: list[float] = []
    finished: list[int] = []
    release = asyncio.Event()

    async def remove() -> list[str]:
        looks.append(1)
        await release.wait()
        finished.append(1)
        return ["s1-thread-0"]

    r.thread.join_watch.remove_departed = remove
    after = r.thread.join_watch.departed_after_s
    assert after == 12.0  # about one join round with a 12 s session
    now = 1_000.0
    r.consumer.rebalancing, r.consumer.rebalancing_since = True, now
    assert not r.thread.join_watch.check_departed(now + after - 1)
    assert r.thread.join_watch.check_departed(now + after)
    await asyncio.sleep(0)
    assert looks == [1]
    # One look at a time, and not more often than every few seconds.
    assert not r.thread.join_watch.check_departed(now + after + DEPARTED_CHECK_EVERY_S + 1)
    release.set()
    await wait_until(lambda: len(finished) == 1, timeout_s=5, message="the first look's end")
    assert not r.thread.join_watch.check_departed(now + after + 1)
    assert r.thread.join_watch.check_departed(now + after + DEPARTED_CHECK_EVERY_S + 1)
    await wait_until(lambda: len(finished) == 2, timeout_s=5, message="the second look's end")
    r.consumer.rebalancing = False
    assert not r.thread.join_watch.check_departed(now + 100 * after)
    assert len(looks) == 2


@pytest.mark.asyncio
async def test_a_member_silent_past_its_session_is_looked_for_without_waiting_to_be_stuck(
    tmp_path: Path,
) -> None:
    # Tansu kept a member frozen (SIGSTOP) just after it joined a round in the rounds that
    # followed, with its tasks, until 17 s after the stop: the others, not stuck joining,
    # never looked for it. Its status, silent past a session, now makes them look.
    r = rig(tmp_path, session_timeout_ms=10_000, heartbeat_interval_ms=1_000)
    looks: list[int] = []
    silent: list[str] = []

    async def remove() -> list[str]:
        looks.append(1)
        return list(silent)

    watch = r.thread.join_watch
    watch.remove_departed = remove
    watch.silences = lambda: dict.fromkeys(silent, 11_000)
    alarms: list[int] = []
    watch.on_removed = lambda: alarms.append(1)
    r.consumer.rebalancing = False
    now = 1_000.0
    assert not watch.check_departed(now)
    silent.append("w3-thread-0")
    assert watch.check_departed(now + 1)
    await wait_until(lambda: looks == [1], timeout_s=5, message="the look")
    # Removed: the broker begins a round without it, and the group is told at once.
    await wait_until(lambda: alarms == [1], timeout_s=5, message="the round alarm")
    assert not watch.check_departed(now + 2)  # not more often than every few seconds
    silent.clear()  # the broker had removed it already: nothing removed, no alarm
    watch.silences = lambda: {"w3-thread-0": 11_000}
    assert watch.check_departed(now + 1 + DEPARTED_CHECK_EVERY_S)
    await wait_until(lambda: looks == [1, 1], timeout_s=5, message="the second look")
    assert alarms == [1]
    watch.silences = None  # a broker that needs no removal: nothing looks
    assert not watch.check_departed(now + 100)


def test_the_join_watch_asks_the_group_s_status_records_for_silent_members() -> None:
    group = GroupLearning(clock=lambda: 0.0)
    now_ms = int(time.time() * 1000)
    group.apply("w3-thread-0", {"generation": 3, "updated_ms": now_ms - 60_000,
                                "acceptable_lag": 10, "learning": {}}, now_ms)
    group.apply("w2-thread-0", {"generation": 3, "updated_ms": now_ms - 11_000,
                                "acceptable_lag": 10, "learning": {}}, now_ms)
    group.apply("w1-thread-0", {"generation": 3, "updated_ms": now_ms,
                                "acceptable_lag": 10, "learning": {}}, now_ms)
    asks = silences_of(group, "w1-thread-0")
    assert past_session(asks(), 30_000) == ["w3-thread-0"]
    assert past_session(asks(), 10_000) == ["w2-thread-0"]


@pytest.mark.asyncio
async def test_a_removal_sounds_the_round_alarm_for_the_member_s_generation(
    tmp_path: Path,
) -> None:
    """As built, the join watch of a cooperative member sounds the process's round alarm, for
    the member's generation, once it removed members."""
    alarm = RoundAlarm()
    r = rig(tmp_path, round_alarm=alarm)
    announced: list[int] = []
    alarm.announce = announced.append
    r.consumer.generation = 7
    alarm.heard(7)  # a round after generation 7 the broker began before, and announced
    assert r.thread.join_watch.on_removed is not None
    r.thread.join_watch.on_removed()
    assert announced == [7, 7]


def test_a_look_is_due_when_a_silence_passes_the_session_within_a_tick() -> None:
    silences = {"w2-thread-0": 300, "w3-thread-0": 9_400}

    async def remove() -> list[str]:
        return []

    watch = JoinWatch("w1", 10_000, SimpleNamespace(rebalancing_for_s=lambda now: 0.0),
                      None, remove, silences=lambda: dict(silences))
    assert watch.next_look_in_s() == pytest.approx(0.62)
    silences["w3-thread-0"] = 8_900  # more than a tick away: the tick looks
    assert watch.next_look_in_s() is None
    silences["w3-thread-0"] = 10_400  # past it already: the tick looks
    assert watch.next_look_in_s() is None
    silences["w3-thread-0"] = 9_990
    watch.remove_departed = None  # a broker that needs no removal
    assert watch.next_look_in_s() is None


async def housekeeping_looks_as_the_silence_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow_publish: bool,
) -> None:
    """Another member's silence passes the session 4 ms from now: the thread's housekeeping
    must look for departed members within 0.5 s (with ``slow_publish``, the status record
    it sends first takes until the silence has passed)."""
    monkeypatch.setattr(join_watch, "PAST_SESSION_MARGIN_MS", 2)
    r = rig(tmp_path)
    watch, reporter = r.thread.join_watch, r.thread.reporter
    session_ms = watch.session_timeout_ms
    passes_at = time.monotonic() + 0.004
    looked = asyncio.Event()
    sent = reporter.publish

    async def publish() -> None:
        while time.monotonic() < passes_at + 0.003:
            await asyncio.sleep(0.001)
        await sent()

    async def remove() -> list[str]:
        looked.set()
        return []

    if slow_publish:
        monkeypatch.setattr(reporter, "publish", publish)
    watch.remove_departed = remove
    watch.silences = lambda: {"w3-thread-0": session_ms + int(
        (time.monotonic() - passes_at) * 1000)}
    housekeeping = asyncio.create_task(reporter.housekeeping(watch))
    try:
        await asyncio.wait_for(looked.wait(), 0.5)
        assert time.monotonic() >= passes_at
    finally:
        r.thread.lifecycle.stopped.set()
        await housekeeping
        r.thread.task_manager.close_all()


@pytest.mark.asyncio
async def test_the_housekeeping_looks_for_departed_members_as_a_silence_passes_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Looked for at the next tick, the member would wait up to a second more, and the round
    # its removal begins with it. (A margin past the session of 2 ms here: this tier allows
    # no wait of 10 ms.)
    await housekeeping_looks_as_the_silence_passes(tmp_path, monkeypatch, slow_publish=False)


@pytest.mark.asyncio
async def test_a_silence_that_passes_the_session_while_the_status_is_sent_is_looked_at_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A status record slow to send (a loaded machine): the look is timed from the check
    # before it, so it comes as soon as the record is sent, not at the next tick.
    await housekeeping_looks_as_the_silence_passes(tmp_path, monkeypatch, slow_publish=True)


def test_the_join_watch_looks_for_a_silent_leader_once_the_broker_s_grace_is_over() -> None:
    """Built with the remover's limits, the watch looks for a silent follower as its session
    ends, and for a silent leader (as the status records say) only after the grace."""
    group = GroupLearning(clock=lambda: 0.0)
    for name, leads in (("w2-thread-0", False), ("w3-thread-0", True)):
        group.apply(name, {"generation": 3, "updated_ms": NOW, "acceptable_lag": 10,
                           "learning": {}, "leader": leads}, NOW)
    assert group.leads("w3-thread-0") and not group.leads("w2-thread-0")
    assert not group.leads("w9-thread-0")
    silences = {"w2-thread-0": 10_500, "w3-thread-0": 10_500}

    async def remove() -> list[str]:
        return []

    watch = JoinWatch("w1", 10_000, SimpleNamespace(rebalancing_for_s=lambda now: 0.0),
                      None, remove, silences=lambda: dict(silences),
                      removable_after_ms=lambda m: removable_after_ms(10_000, group.leads(m)))
    assert watch._removable() == ["w2-thread-0"]
    silences["w2-thread-0"] = 100
    assert watch.next_look_in_s() is None  # the leader: more than a tick before its grace ends
    silences["w3-thread-0"] = 10_000 + EXPIRY_GRACE_MS - 400
    assert watch.next_look_in_s() == pytest.approx(0.42)
    silences["w3-thread-0"] = 10_000 + EXPIRY_GRACE_MS + 100
    assert watch._removable() == ["w3-thread-0"]


def test_a_follower_gives_up_its_sync_once_its_round_s_leader_is_silent_past_its_session(
) -> None:
    """A leader frozen just as it began a round never sends the round's assignment, and the
    embedded broker tells its followers of the leader's expiry only when it gives their
    SyncGroups up (0.8 of a session later): in a static soak the leader's SIGSTOP stalled a
    task 21.5 s. A follower gives its SyncGroup up itself as the leader's silence passes
    the session, and joins the round after."""
    silences = {"w3-thread-0": 9_500}
    abandoned: list[int] = []
    leader = "w3-thread-0-58ce8fb6-c330-41f2-8526-3e64ade35b29"
    pending: list[tuple[int, str] | None] = [(4, leader)]

    def abandon(generation: int, reason: str) -> bool:
        abandoned.append(generation)
        return True

    consumer = SimpleNamespace(rebalancing_for_s=lambda now: 0.0, abandon_sync=abandon,
                               pending_sync_leader=lambda: pending[0])
    watch = JoinWatch("w1", 10_000, consumer, None, None, silences=lambda: dict(silences),
                      leader_key=lambda member_id: thread_id_in(member_id) or member_id)
    assert not watch.check_silent_leader() and not abandoned
    assert watch.next_look_in_s() == pytest.approx(0.52)  # looked for as the session ends
    silences["w3-thread-0"] = 10_100
    assert watch.check_silent_leader() and abandoned == [4]
    assert not watch.check_silent_leader()  # once per generation
    pending[0] = None  # it leads, or waits for no answer
    silences["w3-thread-0"] = 9_900
    assert not watch.check_silent_leader() and watch.next_look_in_s() is None
