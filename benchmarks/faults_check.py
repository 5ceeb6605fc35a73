"""What the fault benchmark concludes from what it produced and what the apps wrote: pure
functions over plain data.

Exactness compares each output case (a key's latest value, or how often an input record came
out) with an independent computation from the input the benchmark produced. Stalls are the
longest gaps in a task's outputs while input flowed.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Exactness:
    """Cases of one output: exact, over (counted too much), under (too little or missing)."""

    cases: int = 0
    exact: int = 0
    over: int = 0
    under: int = 0
    #: By how much, summed over the cases that are over or under.
    over_by: int = 0
    under_by: int = 0
    #: Output keys no input led to, and outputs whose content is wrong (not a count).
    unexpected: int = 0
    wrong: int = 0
    examples: dict[str, Any] = field(default_factory=dict)

    @property
    def is_exact(self) -> bool:
        return self.exact == self.cases and not (self.unexpected or self.wrong)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "is_exact": self.is_exact}


def compare_latest(expected: Mapping[Hashable, int],
                   latest: Mapping[Hashable, int]) -> Exactness:
    """A running figure per key (a count, a total): the latest output against what the
    input says it must be; a key with no output is under by all of it."""
    result = Exactness(cases=len(expected))
    over: dict[str, int] = {}
    under: dict[str, int] = {}
    for key, want in expected.items():
        got = latest.get(key, 0)
        if got == want:
            result.exact += 1
        elif got > want:
            result.over += 1
            result.over_by += got - want
            over[str(key)] = got - want
        else:
            result.under += 1
            result.under_by += want - got
            under[str(key)] = want - got
    result.unexpected = sum(1 for key in latest if key not in expected)
    result.examples = {"over": dict(list(over.items())[:5]),
                       "under": dict(list(under.items())[:5])}
    return result


def compare_occurrences(expected: Iterable[Hashable], seen: Counter[Hashable],
                        wrong: int = 0) -> Exactness:
    """One output per input record (a join's result): once is exact, more is over, none is
    under."""
    wanted = set(expected)
    result = Exactness(cases=len(wanted), wrong=wrong)
    missing: list[str] = []
    for case in wanted:
        n = seen.get(case, 0)
        if n == 1:
            result.exact += 1
        elif n > 1:
            result.over += 1
            result.over_by += n - 1
        else:
            result.under += 1
            result.under_by += 1
            if len(missing) < 5:
                missing.append(str(case))
    result.unexpected = sum(1 for case in seen if case not in wanted)
    result.examples = {"missing": missing}
    return result


@dataclass(frozen=True)
class Stall:
    """A task's longest gap between outputs (or from the start, or until the end)."""

    task: str
    gap_s: float
    from_s: float
    to_s: float


def longest_stalls(times: Mapping[str, Iterable[float]], start: float,
                   end: float) -> dict[str, Stall]:
    """Per task, the longest span within ``[start, end]`` without an output of it. Times
    are seconds on one clock; the spans are reported relative to ``start``."""
    stalls: dict[str, Stall] = {}
    for task, task_times in times.items():
        inside = sorted(t for t in task_times if start <= t <= end)
        edges = [start, *inside, end]
        best = Stall(task, 0.0, 0.0, 0.0)
        for a, b in itertools.pairwise(edges):
            if b - a > best.gap_s:
                best = Stall(task, b - a, a - start, b - start)
        stalls[task] = best
    return stalls


def rebalances(generations: Iterable[int]) -> int:
    """Rebalances seen: the distinct generations the members published, less the first."""
    return max(0, len(set(generations)) - 1)


def gaps(times: Mapping[str, Iterable[float]], start: float, end: float,
         at_least_s: float) -> list[Stall]:
    """Every gap of at least ``at_least_s`` within ``[start, end]`` in any task's outputs,
    in time order; spans relative to ``start``."""
    found: list[Stall] = []
    for task, task_times in times.items():
        inside = sorted(t for t in task_times if start <= t <= end)
        for a, b in itertools.pairwise([start, *inside, end]):
            if b - a >= at_least_s:
                found.append(Stall(task, b - a, a - start, b - start))
    return sorted(found, key=lambda s: (s.from_s, s.task))


@dataclass(frozen=True)
class FaultStall:
    """The longest stall that ended while one fault was the latest, and that fault's limit."""

    at_s: float
    fault: str
    limit_s: float
    stall: Stall | None

    @property
    def over(self) -> bool:
        return self.stall is not None and self.stall.gap_s > self.limit_s


def fault_limit_s(kind: str, seconds: float | None, session_s: float,
                  join_round_s: float) -> float:
    """A fault's stall limit: session timeout + one join round, + the restart delay of a
    kill whose worker comes back within its session (its static member never left the group,
    so its tasks wait for it). ``seconds`` is None for a fault of unknown length."""
    within = kind == "kill" and seconds is not None and seconds < session_s
    return session_s + join_round_s + (seconds if within and seconds is not None else 0.0)


def applied_faults(timeline: Iterable[dict], session_s: float,
                   join_round_s: float) -> list[tuple[float, str, float]]:
    """The faults of a run's timeline that were applied, as ``(at_s, label, limit_s)``: at
    the moment each struck (``struck_s``, where a fault first looks around: a broker kill
    asks who leads what, a second and more under load) or began (``at_s``)."""
    return [(e.get("struck_s", e["at_s"]), f"{e['fault']} {e.get('worker', '')}".strip(),
             fault_limit_s(e["fault"], e.get("seconds"), session_s, join_round_s))
            for e in timeline if e.get("fault") and e.get("status") == "applied"]


def stalls_per_fault(stalls: Iterable[Stall], faults: list[tuple[float, str, float]],
                     end_s: float) -> list[FaultStall]:
    """Per fault ``(at_s, label, limit_s)``, in time order: the longest of ``stalls`` (spans
    on the faults' clock) that ended after the fault and no later than the next one began
    (or ``end_s``): what that fault cost, with what the faults before it left over."""
    ordered = sorted(faults)
    if not ordered:
        return []
    bounds = [*(at for at, _label, _limit in ordered[1:]), end_s]
    result = []
    for (at, label, limit), until in zip(ordered, bounds, strict=True):
        inside = [s for s in stalls if at < s.to_s <= until]
        worst = max(inside, key=lambda s: s.gap_s, default=None)
        result.append(FaultStall(at, label, limit, worst))
    return result
