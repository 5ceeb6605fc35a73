"""Reading rebalance races from worker logs: requests for a rebalance timed from the member's
own sync, and syncs a new round cut short."""

from __future__ import annotations

from pathlib import Path

from benchmarks.scaling_stalls import Ask, Stall, main, member_races

FOLLOWER = """\
2026-11-24 11:03:50,595 INFO coordinator (Re-)joining group g
2026-11-24 11:03:53,599 INFO coordinator Joined group 'g' (generation 1) with member_id m-2
2026-11-24 11:03:58,705 INFO coordinator (Re-)joining group g
2026-11-24 11:04:01,709 INFO coordinator Joined group 'g' (generation 3) with member_id m-2
2026-11-24 11:04:01,709 INFO coordinator Successfully synced group g with generation 3
2026-11-24 11:04:02,711 INFO coordinator (Re-)joining group g
"""
LEARNER = """\
2026-11-24 11:03:52,830 INFO coordinator Joined group 'g' (generation 1) with member_id m-3
2026-11-24 11:03:53,831 INFO coordinator Successfully synced group g with generation 1
a line without a time
2026-11-24 11:03:53,958 INFO streams.thread thread 0 asks for a rebalance: learners ready: ['0_0']
"""


def test_a_sync_cut_short_by_a_new_round_is_a_stall() -> None:
    races = member_races("w2-2", FOLLOWER.splitlines())
    # Generation 1's SyncGroup never came; generation 3's did, so its rejoin is no stall.
    assert races.stalls == [Stall("w2-2", 1, 5.11)]
    assert races.asks == []


def test_a_request_is_timed_from_the_members_own_sync() -> None:
    races = member_races("w3-3", LEARNER.splitlines())
    assert races.asks == [Ask("w3-3", 0.13, "learners ready: ['0_0']")]
    assert races.stalls == []


def test_the_command_reads_every_strategy_of_a_run(tmp_path: Path, capsys) -> None:
    strategy = tmp_path / "relay-learner-20MB"
    strategy.mkdir()
    (strategy / "w2-2.log").write_text(FOLLOWER)
    (strategy / "w3-3.log").write_text(LEARNER)
    main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "1 requests for a rebalance, 1 stalled syncs" in out
    assert "stall w2-2: generation 1, gave up its SyncGroup after 5.11s" in out
    assert "ask   w3-3: 0.13s after its own sync: learners ready" in out
