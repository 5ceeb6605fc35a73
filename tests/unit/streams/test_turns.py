"""The turns across partitions at the fetched records (streams.kafka.turns), as pure
decisions: who holds the turn, how long, and who goes first."""

from __future__ import annotations

from aiokafka.structs import TopicPartition

from streams.kafka.turns import ROUND_S, TurnState, end_turn, take_turns
from streams.runtime.partition_group import MAX_WAIT_FOR_LAGGING_MS

LEFT = [TopicPartition("left", p) for p in range(2)]
RIGHT = [TopicPartition("right", p) for p in range(2)]


def _served(*tps: TopicPartition) -> TurnState:
    return TurnState(served=frozenset(tps))


def test_the_partitions_of_one_number_share_its_turn_one_call_each() -> None:
    # A join's task reads left-0 and right-0: held waiting for the one not handed, it would
    # stall while the turn lasts.
    order = [LEFT[0], RIGHT[0], LEFT[1], RIGHT[1]]
    state = _served(*order)
    handed = []
    for _ in range(4):
        taken = [order[0]]
        handed.append(taken[0])
        order, state = take_turns(order, taken, state, now_s=0.0, turn_s=1.0)
    assert handed == [LEFT[0], RIGHT[0], LEFT[0], RIGHT[0]]
    order, state = end_turn(order, state)
    assert [tp.partition for tp in order] == [1, 1, 0, 0]


def test_a_round_of_turns_stays_well_under_the_wait_for_a_lagging_partition() -> None:
    assert 2 * ROUND_S * 1000 <= MAX_WAIT_FOR_LAGGING_MS
    many = [TopicPartition("t", p) for p in range(10)]
    joined = [TopicPartition("table", p) for p in range(10)]
    for assigned, turn_s in ((many, 1.0), (many + joined, ROUND_S / 10)):
        state = _served(*many)
        order, state = take_turns(many, [many[0]], state, now_s=0.0, turn_s=1.0,
                                  assigned=assigned)
        order, state = take_turns(order, [many[0]], state, now_s=turn_s * 0.99, turn_s=1.0,
                                  assigned=assigned)
        assert order[0] == many[0]
        # With a task that may wait for its other partition, ten numbers buffered: a turn
        # lasts a tenth of the round, not the commit interval.
        order, state = take_turns(order, [many[0]], state, now_s=turn_s, turn_s=1.0,
                                  assigned=assigned)
        assert order[0] == many[1] and order[-1] == many[0]


def test_a_partition_assigned_again_is_a_newcomer_again() -> None:
    a, b = LEFT
    order, state = take_turns([a, b], [a], _served(a, b), now_s=0.0, turn_s=1.0,
                              assigned=[a])
    assert state.served == frozenset({a})
    order, state = take_turns(order, [a], state, now_s=0.0, turn_s=1.0, assigned=[a, b])
    assert order[0] == b
