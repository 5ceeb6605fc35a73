"""The scaling benchmark's pure parts: figures of phases (also when a strategy failed before or
during a change), join rounds, the state prefill's placement and encodings, the phase order."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest
from aiokafka.partitioner import DefaultPartitioner

from benchmarks.scaling import (
    Sizes,
    add_rounds,
    parse_args,
    summarize_phases,
    summary_table,
)
from benchmarks.scaling_analysis import Phase, in_rounds, member_counters, processing_gaps
from benchmarks.scaling_observe import MemberStatus, Output
from benchmarks.scaling_prefill import (
    faust_encoder,
    input_key,
    keys_by_partition,
    relay_encoder,
    relay_position,
)
from benchmarks.scaling_rounds import JoinRounds
from statestore.store import INPUT_POSITION_KEY, KeyValueStore, StoreSpec

SIZES = Sizes(instances=2, partitions=2, keys=10, state_mb=1, value_bytes=100, rate=10)


class _Followed:
    """What run_strategy hands to the summary: outputs and status history."""

    def __init__(self, outputs: list[Output]) -> None:
        self.outputs = outputs
        self.history: list = []


def test_a_strategy_that_failed_before_any_change_is_summarized() -> None:
    result: dict = {"strategy": "faust", "state_mb": 1.0, "error": "StrategyFailed: late",
                    "phases_completed": 0, "start": Phase("start", 100.0, kind="start")}
    followed = _Followed([Output("0_0", 1, 101.0, 0)])
    summarize_phases(result, [], followed, followed, SIZES)  # type: ignore[arg-type]
    assert result["phases"] == [] and result["outputs"] == 1
    assert result["start"]["completed"] is False and result["start"]["ended"] > 0
    add_rounds(result, 3.0)
    table = "\n".join(summary_table(JoinRounds(2, 6000, [3.0]), [result]))
    assert "faust at 1 MB FAILED after 0 phases: StrategyFailed: late" in table


def test_a_change_that_failed_keeps_its_figures() -> None:
    failed = Phase("scale out", 10.0, kind="scale-out", ended=20.0,
                   notes=["failed: StrategyFailed: worker w3 exited"])
    outputs = [Output("0_0", 1, t, i) for i, t in enumerate((9.0, 9.5, 15.0))]
    result: dict = {"strategy": "relay-learner", "state_mb": 100.0, "error": "x",
                    "phases_completed": 0}
    followed = _Followed(outputs)
    summarize_phases(result, [failed], followed, followed, SIZES)  # type: ignore[arg-type]
    add_rounds(result, 2.0)
    [phase] = result["phases"]
    assert phase["longest_gap_unmoved_s"] == pytest.approx(5.5)
    assert phase["longest_gap_unmoved_rounds"] == pytest.approx(2.75)
    assert phase["to_balance_rounds"] is None
    row = next(line for line in summary_table(JoinRounds(2, 6000, [2.0]), [result])
               if "| scale-out |" in line)
    assert "failed" in row and "5.5 s (2.8 r)" in row


def test_gaps_in_rounds() -> None:
    assert in_rounds(6.0, 3.0) == 2.0
    assert in_rounds(None, 3.0) is None
    assert in_rounds(6.0, None) is None
    assert JoinRounds(2, 6000, [3.0, 9.0, 4.0]).median_s == 4.0
    assert JoinRounds(2, 6000).median_s is None


def test_a_moved_task_is_told_from_an_unmoved_one() -> None:
    phase = Phase("scale out", 10.0, ended=20.0)
    outputs = [Output("0_0", 1, 9.0, 0), Output("0_0", 2, 14.0, 1),
               Output("0_1", 1, 9.0, 2), Output("0_1", 1, 11.0, 3)]
    processing_gaps([phase], outputs)
    assert phase.moved_tasks == ["0_0"]
    assert phase.longest_gap_moved_s == pytest.approx(6.0)
    assert phase.longest_gap_unmoved_s == pytest.approx(9.0)  # its last output to the end


def test_prefilled_keys_land_where_the_input_sends_them() -> None:
    placed = keys_by_partition(50, 3)
    assert sorted(k for keys in placed for k in keys) == list(range(50))
    partitioner = DefaultPartitioner()
    for partition, keys in enumerate(placed):
        for index in keys:
            assert partitioner(input_key(index), [0, 1, 2], [0, 1, 2]) == partition


def test_the_prefill_writes_each_framework_s_encoding() -> None:
    key, value = relay_encoder()("k7", {"n": 2, "blob": "xy"})
    spec = StoreSpec("state")
    assert spec.key_serde.loads(key) == "k7"
    assert msgpack.unpackb(value) == {"n": 2, "blob": "xy"}
    key, value = faust_encoder()("k7", {"n": 2, "blob": "xy"})
    assert json.loads(key) == "k7" and json.loads(value) == {"n": 2, "blob": "xy"}


def test_relay_s_prefill_marks_the_input_position_its_state_reflects(tmp_path: Path) -> None:
    """A store restored from the prefill applies it (a changelog without input positions is
    held back whole): the position record names the input partition at offset 0."""
    key, value = relay_position("app-in")(2)
    assert key == INPUT_POSITION_KEY
    store = KeyValueStore(StoreSpec("state"), tmp_path / "s", "app-state-changelog", 2,
                          tracks_input=True).open()
    try:
        store.apply_restore_batch([relay_encoder()("k1", {"n": 1}), (key, value)], 2)
        assert store.read_input_position() == {"app-in:2": 0}
    finally:
        store.close()


def test_state_size_sets_the_records_per_task() -> None:
    assert Sizes(2, 4, 100, 800, 8000, 400).records_per_task == 100_000
    assert Sizes(2, 4, 100, 0.0001, 8000, 400).records_per_task == 1


def test_default_phases_and_their_order() -> None:
    args = parse_args([])
    assert args.phases == ["scale-out", "scale-in", "scale-out", "hand-over",
                           "rolling-restart"]
    assert args.state_mb == [100.0, 800.0]
    assert args.strategies == ["relay-learner", "relay-learner-static",
                               "relay-learner-standby", "relay-stop-the-world", "faust",
                               "kafka-streams-warmup", "kafka-streams-standby"]
    with pytest.raises(SystemExit):
        parse_args(["--phases", "hand-over"])


def test_a_member_restarted_in_a_phase_counts_its_new_process_from_zero() -> None:
    def status(pid: int, restored: int, at_s: float, generation: int = 3) -> MemberStatus:
        return MemberStatus("w1-thread-0", pid, generation, frozenset({"0_0"}), False,
                            restored, int(at_s * 1000))

    phase = Phase("rolling restart", started=10.0)
    # The old process had restored 50,000 records; the restart (same static key) restores
    # 100 more in its own count, and the group never rebalances.
    history = [status(1, 50_000, 9.0), status(1, 50_000, 11.0), status(2, 0, 12.0),
               status(2, 100, 13.0)]
    member_counters(phase, history, counted_until=20.0)
    assert phase.restored_records == 100
    assert phase.rebalances == 0
