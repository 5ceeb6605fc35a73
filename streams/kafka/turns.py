"""Turns across partitions: the order in which a thread is handed the records its consumer
fetched, decided over plain data (the driver applies it to aiokafka's fetch buffer).

aiokafka hands out its fetched records partition by partition, in the order they were
fetched, so a task moved to a thread waited behind the backlogs of the tasks moved with it.
Handing each partition one fetch call in turn fixed that, but it also made every task of a
thread process records in every commit interval: each of its stores then shipped a changelog
record for nearly every key it holds at each commit, where one partition after another
shipped a store's keys about once a turn (the counting benchmark's changelog records went up
3 times, and its throughput down 5 %).

So a turn lasts a commit interval: it ends with the thread's offset commit, or once it has
lasted the interval (an exactly-once thread commits through its producer). A store touched
in a turn then ships its keys about once per turn. A turn belongs to a partition number, the
unit of co-partitioning: the partitions of a task reading several topics (a join, a
repartition topic and a source) share it, one fetch call each, so the task is not held
waiting for its other partitions while the turn lasts. Where a partition number has
several partitions, a round of turns lasts at most :data:`ROUND_S` (each turn is shortened
for it): a task left waiting for one of its partitions at the end of its turn has it again
well before the partition group's limit
(``streams.runtime.partition_group.MAX_WAIT_FOR_LAGGING_MS``), after which it would go on
without it. A partition handed nothing since it was assigned (a task just moved here) goes
first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from aiokafka.structs import TopicPartition

#: The longest a round of turns (one for every partition number buffered) lasts: half of
#: the time a task waits for a lagging partition before it goes on without it.
ROUND_S = 2.5


@dataclass(frozen=True)
class TurnState:
    """Whose turn it is (a partition number), since when, and which partitions were handed
    records yet."""

    holder: int | None = None
    started_s: float = 0.0
    served: frozenset[TopicPartition] = field(default_factory=frozenset)


def newcomers_first(order: Sequence[TopicPartition], state: TurnState) -> list[TopicPartition]:
    """``order`` with the partitions handed nothing yet moved to the front."""
    newcomers = [tp for tp in order if tp not in state.served]
    if not newcomers:
        return list(order)
    return newcomers + [tp for tp in order if tp in state.served]


def take_turns(order: Sequence[TopicPartition], taken: Sequence[TopicPartition],
               state: TurnState, now_s: float, turn_s: float,
               assigned: Iterable[TopicPartition] | None = None,
               ) -> tuple[list[TopicPartition], TurnState]:
    """The hand-out order after a fetch call handed out ``taken`` (in hand-out order) from
    the buffered partitions ``order``, and the state of the turns then. ``assigned``: the
    partitions assigned now (served partitions no longer assigned are forgotten, so one
    assigned again is a newcomer again)."""
    served = state.served | frozenset(taken)
    known = list(order)
    if assigned is not None:
        assigned = frozenset(assigned)
        served &= assigned
        known += assigned
    holder, started = state.holder, state.started_s
    if taken and taken[0].partition != holder:
        holder, started = taken[0].partition, now_s
    just_taken = set(taken)
    # Within the turn, its partitions take one call each in turn.
    in_turn = ([tp for tp in order if tp.partition == holder and tp not in just_taken]
               + [tp for tp in order if tp.partition == holder and tp in just_taken])
    others = [tp for tp in order if tp.partition != holder]
    if _co_partitioned(known):
        turn_s = min(turn_s, ROUND_S / (len({tp.partition for tp in others}) + 1))
    if holder is not None and now_s - started >= turn_s:
        rest, holder = others + in_turn, None
    else:
        rest = in_turn + others
    state = TurnState(holder, started, served)
    return newcomers_first(rest, state), state


def end_turn(order: Sequence[TopicPartition], state: TurnState,
             ) -> tuple[list[TopicPartition], TurnState]:
    """The turn ends now (its thread committed): its partitions go to the back."""
    holder = state.holder
    if holder is None:
        return list(order), state
    rest = ([tp for tp in order if tp.partition != holder]
            + [tp for tp in order if tp.partition == holder])
    return rest, TurnState(None, state.started_s, state.served)


def _co_partitioned(partitions: Iterable[TopicPartition]) -> bool:
    """Whether a partition number has several partitions (of several topics) here: a task may
    then wait for one of its partitions."""
    numbers: dict[int, str] = {}
    return any(numbers.setdefault(tp.partition, tp.topic) != tp.topic for tp in partitions)
