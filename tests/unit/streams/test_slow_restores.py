"""When a member calls an active's restore slow (worth handing to a caught-up copy
elsewhere), and the state updater telling its thread so."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from streams.group.slow_restores import RestoreWatch, is_slow
from streams.runtime.state_updater import StateUpdater
from streams.runtime.tasks import Tasks
from tests.unit.streams.fakes import FakeChangelogReader


def test_a_restore_is_slow_only_far_behind_with_a_trusted_rate_that_outlasts_the_lead() -> None:
    # 1,000 records/s, 60,000 to go: a minute, against a lead of 2 s.
    assert is_slow(2.0, 2_000, 60_000, 2.0, acceptable_lag=10_000)
    # Within the acceptable lag: the owner is as good as any copy.
    assert not is_slow(2.0, 2_000, 9_000, 2.0, acceptable_lag=10_000)
    # A rate read for under a second is not trusted yet.
    assert not is_slow(0.5, 500, 60_000, 2.0, acceptable_lag=10_000)
    # Done within the lead at its rate (100,000 records/s, 60,000 to go: 0.6 s).
    assert not is_slow(1.0, 100_000, 60_000, 2.0, acceptable_lag=10_000)
    # No progress at all in over a second: slow.
    assert is_slow(1.5, 0, 60_000, 2.0, acceptable_lag=10_000)


def test_the_watch_judges_each_restore_once_and_forgets_finished_ones() -> None:
    watch = RestoreWatch()
    assert watch.judge({"0_1": 90_000, "0_2": 20_000}, 10.0, 1.0, 1_000) == []
    # One second on: 0_1 read 1,000 (89 s to go), 0_2 read 18,000 (0.1 s to go).
    assert watch.judge({"0_1": 89_000, "0_2": 2_000}, 11.0, 1.0, 1_000) == ["0_1"]
    assert watch.judge({"0_1": 88_000}, 12.0, 1.0, 1_000) == []
    assert watch.slow_lags({"0_1": 88_000}) == {"0_1": 88_000}
    # 0_1 left the restore (handed over, or restored): forgotten, judged again if it comes back.
    assert watch.judge({}, 13.0, 1.0, 1_000) == []
    assert watch.slow == set() and watch.started == {}


def test_nothing_is_judged_while_the_join_round_is_not_known() -> None:
    watch = RestoreWatch()
    watch.judge({"0_1": 90_000}, 10.0, None, 1_000)
    assert watch.judge({"0_1": 89_000}, 11.0, None, 1_000) == []
    # Known at last: the rate since the restore began counts.
    assert watch.judge({"0_1": 88_000}, 12.0, 1.0, 1_000) == ["0_1"]


@dataclass
class _Thread:
    round_s: float = 1.0
    told: list[list[str]] = field(default_factory=list)

    def learners_ready(self, task_ids: list[str]) -> None:
        pass

    def restores_slow(self, task_ids: list[str]) -> None:
        self.told.append(task_ids)

    def join_round_s(self) -> float:
        return self.round_s


class _Store:
    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.name = "counts"
        self.changelog_topic = "app-counts-changelog"


def test_the_state_updater_tells_its_thread_of_slow_restores_and_reports_them() -> None:
    tasks, restorer = Tasks(), FakeChangelogReader()
    updater = StateUpdater(restorer, FakeChangelogReader(), tasks, commit_interval_ms=1000,
                           acceptable_lag=1_000, learner_rejoin="batched")
    thread = _Thread()

    async def restored(task_id: str, stores: object) -> None:
        await asyncio.sleep(0)

    class _Listener:
        start_restored = staticmethod(restored)

    updater.report_to(_Listener(), ready=thread, slow=thread)
    tasks.add_restoring("0_1", {"counts": _Store(1)})  # type: ignore[dict-item]
    restorer.lags = {"1": 50_000}
    updater.check_slow_restores(now=100.0)
    restorer.lags = {"1": 49_900}
    updater.check_slow_restores(now=101.5)
    assert thread.told == [["0_1"]]
    assert updater.slow_restores() == {"0_1": 49_900}
    updater.check_slow_restores(now=102.0)
    assert thread.told == [["0_1"]], "told once"
    tasks.remove_restoring("0_1")
    updater.check_slow_restores(now=103.0)
    assert updater.slow_restores() == {}


def test_without_a_thread_to_tell_nothing_is_judged() -> None:
    tasks, restorer = Tasks(), FakeChangelogReader()
    updater = StateUpdater(restorer, FakeChangelogReader(), tasks, commit_interval_ms=1000,
                           acceptable_lag=1_000, learner_rejoin="batched")
    tasks.add_restoring("0_1", {"counts": _Store(1)})  # type: ignore[dict-item]
    restorer.lags = {"1": 50_000}
    updater.check_slow_restores(now=100.0)
    updater.check_slow_restores(now=110.0)
    assert updater.slow_restores() == {}
