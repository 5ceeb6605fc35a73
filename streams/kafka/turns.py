"""Turns across partitions: the order in which a thread is handed the records its consumer
fetched, decided over plain data (the driver applies it to aiokafka's fetch buffer).

aiokafka hands out its fetched records partition by partition, in the order they were
fetched, so a task moved to a thread waited behind the backlogs of the tasks moved with it.
Handing each partition one fetch call in turn fixed that, but it also made every task of a
thread process records in every commit interval: each of its stores then ships a changelog
record for nearly every key it holds at each commit, where one partition after another
shipped a store's keys about once a turn (the counting benchmark's changelog records went
up 3 times, and its throughput down 5 %).

So a turn lasts a commit interval: it ends with the thread's offset commit, or once it has
lasted the interval (an exactly-once thread commits through its producer). A store touched
in a turn then ships its keys about once per turn, and no partition waits for more than an
interval per other partition. A partition handed nothing since it was assigned (a task just
moved here) goes first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

P = TypeVar("P")


@dataclass(frozen=True)
class TurnState:
    """Whose turn it is, since when, and which partitions were handed records yet."""

    holder: object | None = None
    started_s: float = 0.0
    served: frozenset[object] = field(default_factory=frozenset)


def newcomers_first(order: Sequence[P], state: TurnState) -> list[P]:
    """``order`` with the partitions handed nothing yet moved to the front."""
    newcomers = [p for p in order if p not in state.served]
    if not newcomers:
        return list(order)
    return newcomers + [p for p in order if p in state.served]


def take_turns(order: Sequence[P], taken: Sequence[P], state: TurnState, now_s: float,
               turn_s: float, assigned: Iterable[P] | None = None,
               ) -> tuple[list[P], TurnState]:
    """The hand-out order after a fetch call handed out ``taken`` (in hand-out order) from
    the buffered partitions ``order``, and the state of the turns then. ``assigned``: the
    partitions assigned now (served partitions no longer assigned are forgotten, so one
    assigned again is a newcomer again)."""
    served = state.served | frozenset(taken)
    if assigned is not None:
        served &= frozenset(assigned)
    holder, started = state.holder, state.started_s
    if taken and taken[0] != holder:
        holder, started = taken[0], now_s
    rest = list(order)
    if holder is not None and now_s - started >= turn_s:
        just_taken = set(taken)
        rest = ([p for p in rest if p not in just_taken]
                + [p for p in rest if p in just_taken])
        holder = None
    state = TurnState(holder, started, served)
    return newcomers_first(rest, state), state


def end_turn(order: Sequence[P], state: TurnState) -> tuple[list[P], TurnState]:
    """The turn ends now (its thread committed): its holder goes to the back."""
    holder = state.holder
    if holder is None:
        return list(order), state
    rest = [p for p in order if p != holder] + [p for p in order if p == holder]
    return rest, TurnState(None, state.started_s, state.served)
