"""The scaling benchmark's figures, computed from what was observed: for each group change,
the longest processing gap of a task that moved and of tasks that did not, the rebalances,
the changelog records restored, the input records processed more than once; and the
throughput over time. Rebalances, records restored and records reprocessed count from a
change's start until the next change starts (work a change causes may end a little after the
group is balanced).

A task *moved* in a phase when more than one process produced its outputs between the phase's
start and its end (counting the owner just before the start). Its processing gap is the
longest time between two consecutive outputs of the task in that span, including the time
from its last output before the change and the time from its last output to the phase's end.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

from benchmarks.scaling_observe import MemberStatus, Output


@dataclass
class Phase:
    """One group change and what it cost."""

    name: str
    started: float
    #: scale-out, scale-in, hand-over, rolling-restart (or start).
    kind: str = ""
    ended: float = 0.0
    #: The change ran to its end (balanced or not); False when the strategy failed in it.
    completed: bool = False
    balanced: bool = False
    seconds_to_balance: float | None = None
    moved_tasks: list[str] = field(default_factory=list)
    #: The process that last processed each task before the change, and at the phase's end.
    owners_before: dict[str, int] = field(default_factory=dict)
    owners_after: dict[str, int] = field(default_factory=dict)
    longest_gap_moved_s: float | None = None
    longest_gap_unmoved_s: float | None = None
    rebalances: int = 0
    restored_records: int = 0
    reprocessed_records: int = 0
    notes: list[str] = field(default_factory=list)


def processing_gaps(phases: list[Phase], outputs: list[Output]) -> None:
    """Fill in moved tasks and the longest gaps of moved and unmoved tasks."""
    by_task: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for output in outputs:
        by_task[output.task].append((output.t, output.pid))
    for series in by_task.values():
        series.sort()
    for phase in phases:
        moved_gaps: list[float] = []
        unmoved_gaps: list[float] = []
        moved: list[str] = []
        for task, series in sorted(by_task.items()):
            before = [(t, pid) for t, pid in series if t < phase.started][-1:]
            inside = [(t, pid) for t, pid in series if phase.started <= t <= phase.ended]
            span = before + inside
            if before:
                phase.owners_before[task] = before[-1][1]
            if span:
                phase.owners_after[task] = span[-1][1]
            times = [t for t, _ in span] + [phase.ended]
            if not before:
                times.insert(0, phase.started)
            gap = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
            if len({pid for _, pid in span}) > 1:
                moved.append(task)
                moved_gaps.append(gap)
            else:
                unmoved_gaps.append(gap)
        phase.moved_tasks = moved
        phase.longest_gap_moved_s = max(moved_gaps, default=None)
        phase.longest_gap_unmoved_s = max(unmoved_gaps, default=None)


def reprocessed_records(phases: list[Phase], outputs: list[Output],
                        counted_until: list[float]) -> None:
    """Count, per phase (from its start to ``counted_until``), outputs of input records that
    had been processed before."""
    seen: set[int] = set()
    for output in sorted(outputs, key=lambda o: o.t):
        if output.seq in seen:
            for phase, until in zip(phases, counted_until, strict=True):
                if phase.started <= output.t < until:
                    phase.reprocessed_records += 1
        seen.add(output.seq)


def member_counters(phase: Phase, history: list[MemberStatus], counted_until: float) -> None:
    """Rebalances (generations past the last one before the change) and changelog records
    restored by every member (standby and learner copies included) from the phase's start
    to ``counted_until``."""
    start_ms, end_ms = phase.started * 1000, counted_until * 1000
    before = [s for s in history if s.updated_ms < start_ms]
    during = [s for s in history if start_ms <= s.updated_ms <= end_ms]
    baseline = max((s.generation for s in before), default=-1)
    phase.rebalances = max(0, max((s.generation for s in during), default=baseline) - baseline)
    # A process counts from zero: a member restarted during the phase (a static member keeps
    # its key) is a new counter, not a smaller one.
    restored_before: dict[tuple[str, int], int] = {}
    for s in before:
        restored_before[s.key, s.pid] = s.restored_records
    restored_after: dict[tuple[str, int], int] = {}
    for s in during:
        restored_after[s.key, s.pid] = s.restored_records
    phase.restored_records = sum(
        n - restored_before.get(key, 0) for key, n in restored_after.items())


def throughput(outputs: list[Output], started: float, task: str | None = None) -> list[int]:
    """Outputs (of one task, or all) per second since ``started``."""
    buckets: dict[int, int] = defaultdict(int)
    for output in outputs:
        if output.t >= started and (task is None or output.task == task):
            buckets[int(output.t - started)] += 1
    last = max((int(o.t - started) for o in outputs if o.t >= started), default=-1)
    return [buckets.get(i, 0) for i in range(last + 1)]


def in_rounds(seconds: float | None, round_s: float | None) -> float | None:
    """A duration in join rounds of the broker (None when either is unknown)."""
    if seconds is None or not round_s:
        return None
    return seconds / round_s
