"""``python -m benchmarks.assignor``: how long one assignment takes and how large the group's
metadata is (every subscription and assignment), at Kafka-Streams-like scale.

Two rounds are timed: a cold start (no member owns anything) and a stable group joined by one
new instance (the round that places learners). Targets: under 1 s and under 1 MiB.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

from assignor import AssignorConfig, Member, MemberAssignment, Task, assign
from assignor.protocol import Subscription, encode_assignment, encode_subscription


def build(tasks: int, instances: int, threads: int, subtopologies: int) -> list[Task]:
    per_sub = max(1, tasks // subtopologies)
    return [Task(f"{s}_{p}", stateful=s % 2 == 0) for s in range(subtopologies)
            for p in range(per_sub)][:tasks]


def members_of(
    assignments: dict[str, MemberAssignment], instance_threads: dict[str, tuple[str, int]]
) -> list[Member]:
    """Members as they report themselves after following ``assignments``."""
    members = []
    for mid, (inst, thread) in sorted(instance_threads.items()):
        mine = assignments.get(mid, MemberAssignment())
        members.append(Member(mid, inst, thread, frozenset(mine.active),
                              {t: 0 for t in mine.standbys}, {}))
    return members


def timed(fn, repeat: int) -> tuple[float, float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--threads", type=int, default=5)
    parser.add_argument("--subtopologies", type=int, default=10)
    parser.add_argument("--standbys", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if min(args.tasks, args.instances, args.threads, args.subtopologies) < 1:
        parser.error("--tasks, --instances, --threads and --subtopologies must be >= 1")

    tasks = build(args.tasks, args.instances, args.threads, args.subtopologies)
    config = AssignorConfig(num_standbys=args.standbys)
    layout = {f"i{i:03d}-{t}": (f"i{i:03d}", t)
              for i in range(args.instances) for t in range(args.threads)}
    cold_best, cold_median, (cold, memory) = timed(
        lambda: assign(tasks, members_of({}, layout), config, 0, None), args.repeat)
    stable_members = members_of(cold, layout)
    _, _, (settled, memory) = timed(lambda: assign(tasks, stable_members, config, 1, memory), 1)
    joined = dict(layout)
    joined.update({f"new-{t}": ("new", t) for t in range(args.threads)})
    grown = members_of(settled, joined)
    join_best, join_median, (after_join, _) = timed(
        lambda: assign(tasks, grown, config, 2, memory), args.repeat)

    sizes = 0
    for member in grown:
        sub = Subscription(member.instance_id, member.thread, 1, tuple(member.active),
                           dict(member.standbys), {})
        sizes += len(encode_subscription(sub))
    for assignment in after_join.values():
        sizes += len(encode_assignment(assignment))
    learners = sum(len(a.learners) for a in after_join.values())
    result = {
        "tasks": len(tasks), "instances": args.instances, "threads": args.threads,
        "members": len(grown), "num_standbys": args.standbys,
        "cold_start_seconds": {"best": cold_best, "median": cold_median},
        "join_round_seconds": {"best": join_best, "median": join_median},
        "learners_placed_on_join": learners,
        "metadata_bytes": sizes, "metadata_mib": sizes / 2**20,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(f"{len(tasks)} tasks, {len(grown)} members ({args.instances + 1} instances x "
          f"{args.threads} threads)")
    print(f"cold start:   best {cold_best:.3f}s  median {cold_median:.3f}s")
    print(f"one new instance: best {join_best:.3f}s  median {join_median:.3f}s "
          f"({learners} learners placed)")
    print(f"metadata: {sizes:,} bytes ({sizes / 2**20:.3f} MiB) for all subscriptions and "
          f"assignments")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
