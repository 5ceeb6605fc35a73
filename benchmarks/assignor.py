"""``python -m benchmarks.assignor``: how long one assignment takes and how large the group's
metadata is (every subscription, with the leader's notes each member echoes, and every
assignment), at Kafka-Streams-like scale, and how both grow between sizes.

Two rounds are timed per size: a cold start (no member owns anything) and a stable group
joined by one new instance (the round that places learners). Targets: 10,000 tasks over 500
members in under 0.2 s cold, 50,000 tasks over 1,600 members in under 1 s, and the metadata
under 1 MiB at 50,000 tasks.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from assignor import AssignorConfig, Member, MemberAssignment, Task, assign
from assignor.protocol import Subscription, encode_assignment, encode_subscription

DEFAULT_SIZES = ("10000:100:5", "50000:200:8")


def build(tasks: int, subtopologies: int) -> list[Task]:
    per_sub = -(-tasks // subtopologies)
    return [Task(f"{s}_{p}", stateful=s % 2 == 0) for s in range(subtopologies)
            for p in range(per_sub)][:tasks]


def members_of(
    assignments: dict[str, MemberAssignment], instance_threads: dict[str, tuple[str, int]]
) -> list[Member]:
    """Members as they report themselves after following ``assignments`` (copies caught up,
    the leader's notes echoed)."""
    members = []
    for mid, (inst, thread) in sorted(instance_threads.items()):
        mine = assignments.get(mid, MemberAssignment())
        members.append(Member(mid, inst, thread, frozenset(mine.active),
                              {t: 0 for t in mine.standbys}, {t: 0 for t in mine.learners},
                              notes=mine.notes))
    return members


def timed(fn: Callable[[], Any], repeat: int) -> tuple[dict[str, float], Any]:
    """Best and median wall time, and the best CPU time of this process (which other
    processes on a busy machine disturb less)."""
    times, cpu, result = [], [], None
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {"best": min(times), "median": statistics.median(times), "cpu_best": min(cpu)}, result


def metadata_bytes(members: list[Member], assignments: dict[str, MemberAssignment]) -> int:
    size = 0
    for member in members:
        sub = Subscription(member.instance_id, member.thread, 1, tuple(sorted(member.active)),
                           dict(member.standbys), dict(member.learners), notes=member.notes)
        size += len(encode_subscription(sub))
    for assignment in assignments.values():
        size += len(encode_assignment(assignment))
    return size


def measure(tasks_n: int, instances: int, threads: int, subtopologies: int,
            config: AssignorConfig, repeat: int) -> dict[str, Any]:
    tasks = build(tasks_n, subtopologies)
    layout = {f"i{i:04d}-{t}": (f"i{i:04d}", t) for i in range(instances) for t in range(threads)}
    members = members_of({}, layout)
    cold_time, (cold, memory) = timed(lambda: assign(tasks, members, config, 0, None), repeat)
    _, (settled, memory) = timed(
        lambda: assign(tasks, members_of(cold, layout), config, 1, memory), 1)
    joined = dict(layout)
    joined.update({f"new-{t}": ("new", t) for t in range(threads)})
    grown = members_of(settled, joined)
    join_time, (after_join, _) = timed(lambda: assign(tasks, grown, config, 2, memory), repeat)
    # The group's metadata once it has followed the join round (notes echoed).
    echoed = members_of(after_join, joined)
    size = metadata_bytes(echoed, after_join)
    return {
        "tasks": len(tasks), "instances": instances, "threads": threads,
        "members": len(grown), "num_standbys": config.num_standbys,
        "max_learners": config.max_learners,
        "cold_start_seconds": cold_time,
        "join_round_seconds": join_time,
        "learners_placed_on_join": sum(len(a.learners) for a in after_join.values()),
        "metadata_bytes": size, "metadata_mib": size / 2**20,
    }


def growth(small: dict[str, Any], large: dict[str, Any]) -> dict[str, float]:
    def ratio(key: str) -> float:
        a, b = small[key], large[key]
        if isinstance(a, dict):
            a, b = a["cpu_best"], b["cpu_best"]
        return b / a if a else float("inf")

    return {"tasks": ratio("tasks"), "members": ratio("members"),
            "cold_start": ratio("cold_start_seconds"), "join_round": ratio("join_round_seconds"),
            "metadata": ratio("metadata_bytes")}


def parse_size(text: str) -> tuple[int, int, int]:
    try:
        tasks, instances, threads = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"size {text!r}: expected TASKS:INSTANCES:THREADS, e.g. 50000:200:8") from None
    if min(tasks, instances, threads) < 1:
        raise argparse.ArgumentTypeError(f"size {text!r}: every number must be >= 1")
    return tasks, instances, threads


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=None,
                        metavar="TASKS:INSTANCES:THREADS",
                        help=f"sizes to measure, in order (default {' '.join(DEFAULT_SIZES)})")
    parser.add_argument("--tasks", type=int, default=None,
                        help="one size: this many tasks (with --instances and --threads)")
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--threads", type=int, default=5)
    parser.add_argument("--subtopologies", type=int, default=10)
    parser.add_argument("--standbys", type=int, default=1)
    parser.add_argument("--max-learners", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.tasks is not None and args.sizes is not None:
        parser.error("give either --sizes or --tasks, not both")
    if args.tasks is not None:
        sizes = [parse_size(f"{args.tasks}:{args.instances}:{args.threads}")]
    else:
        sizes = args.sizes or [parse_size(s) for s in DEFAULT_SIZES]
    if args.subtopologies < 1 or args.repeat < 1:
        parser.error("--subtopologies and --repeat must be >= 1")
    config = AssignorConfig(num_standbys=args.standbys, max_learners=args.max_learners)

    results = []
    for tasks_n, instances, threads in sizes:
        result = measure(tasks_n, instances, threads, args.subtopologies, config, args.repeat)
        results.append(result)
        cold, join = result["cold_start_seconds"], result["join_round_seconds"]
        print(f"{result['tasks']:,} tasks, {result['members']:,} members ({instances} + 1 "
              f"instances x {threads} threads), {args.standbys} standby(s), max_learners "
              f"{args.max_learners}")
        print(f"  cold start:       best {cold['best']:.3f}s  median {cold['median']:.3f}s  "
              f"(cpu {cold['cpu_best']:.3f}s)")
        print(f"  one new instance: best {join['best']:.3f}s  median {join['median']:.3f}s  "
              f"(cpu {join['cpu_best']:.3f}s; {result['learners_placed_on_join']} learners "
              f"placed)")
        print(f"  metadata: {result['metadata_bytes']:,} bytes "
              f"({result['metadata_mib']:.3f} MiB) for all subscriptions and assignments")
    grown = [growth(a, b) for a, b in itertools.pairwise(results)]
    for (a, b), g in zip(itertools.pairwise(results), grown, strict=True):
        print(f"growth {a['tasks']:,} -> {b['tasks']:,} tasks: x{g['tasks']:.1f} tasks, "
              f"x{g['members']:.1f} members; cpu time of a cold start x{g['cold_start']:.1f}, "
              f"of one join x{g['join_round']:.1f}; metadata x{g['metadata']:.1f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data: dict[str, Any] = (dict(results[0], peak_rss_mib=peak) if len(results) == 1
                                else {"results": results, "growth": grown, "peak_rss_mib": peak})
        args.json.write_text(json.dumps(data, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
