"""A member waiting to ask for a round waits while another member of its round is silent but
not yet out of its session (the quirk late-follower-sync): a test that waits out real time,
so it lives in the broker tier."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from streams.group.group_learning import GroupLearning
from streams.quirks.synced_round import RoundReports
from tests.conftest import wait_until
from tests.unit.streams.fakes import assign, rig


async def test_a_member_asks_for_a_round_only_once_no_member_of_its_round_is_silent(
        tmp_path: Path) -> None:
    # A member frozen (SIGSTOP) but not yet out of its session: a round asked for then (ready
    # learners) took it in with its cached subscription, and its session's end started
    # another one: the tasks it held waited a round more.
    learning = GroupLearning()
    r = rig(tmp_path, round_reports=RoundReports(), group_learning=learning)
    try:
        await assign(r, ("0_0",))
        generation = r.thread.member.generation
        now_ms = int(time.time() * 1000)

        def publish(updated_ms: int) -> None:
            learning.apply("other-thread-0", {"learning": {}, "generation": generation,
                                              "updated_ms": updated_ms, "acceptable_lag": 10},
                           now_ms)

        publish(now_ms - 4_000)
        assert learning.silent(r.thread.member.identity.label, generation, now_ms,
                               10_000) == ["other-thread-0"]
        # Past its session (and a publication), the broker has ended it: not waited for.
        assert learning.silent("me", generation, now_ms + 8_000, 10_000) == []
        r.thread.member.request_rejoin_once_synced("learners ready")
        await asyncio.sleep(0.5)
        assert r.consumer.rejoins == 0
        publish(int(time.time() * 1000))  # back
        await wait_until(lambda: r.consumer.rejoins == 1)
    finally:
        r.thread.member.close()
        r.thread.task_manager.close_all()
