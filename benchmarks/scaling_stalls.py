"""Rebalance races in a scaling run, read from the Relay workers' logs.

``python -m benchmarks.scaling_stalls RUN_DIR [...]`` lists, per strategy directory of a run
(the worker logs ``w*.log`` that ``benchmarks.scaling`` keeps):

- every request for a rebalance, with how long after the asking member's own SyncGroup
  answer it came, and why;
- every *stalled sync*: a member got its JoinGroup answer, never got its SyncGroup answer,
  and joined again (on Tansu, a new round started while the member still waited for its
  SyncGroup answer holds it about five seconds and it misses the round).

The figures come from aiokafka's and Relay's INFO log lines, so they need
``--worker-log-level INFO`` (the default).
"""

from __future__ import annotations

import argparse
import datetime
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

_JOINED = re.compile(r"Joined group .*\(generation (\d+)\)")
_SYNCED = "Successfully synced group"
_REJOINING = "(Re-)joining group"
_ASKS = re.compile(r"asks for a rebalance: (.*)$")


@dataclass(frozen=True)
class Ask:
    member: str
    #: Seconds since the member's own last SyncGroup answer (None before its first).
    after_sync_s: float | None
    reason: str


@dataclass(frozen=True)
class Stall:
    member: str
    generation: int
    #: Seconds from the JoinGroup answer to giving up on the SyncGroup answer.
    waited_s: float


@dataclass
class Races:
    asks: list[Ask] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)


def _time(line: str) -> float | None:
    try:
        stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return None
    return stamp.replace(tzinfo=datetime.UTC).timestamp()


def member_races(member: str, lines: Iterable[str]) -> Races:
    """The asks and stalled syncs in one member's log lines."""
    races = Races()
    joined: tuple[float, int] | None = None
    last_sync: float | None = None
    for line in lines:
        at = _time(line)
        if at is None:
            continue
        if (match := _JOINED.search(line)) is not None:
            joined = (at, int(match.group(1)))
        elif _SYNCED in line:
            joined, last_sync = None, at
        elif _REJOINING in line and joined is not None:
            races.stalls.append(Stall(member, joined[1], round(at - joined[0], 2)))
            joined = None
        elif (match := _ASKS.search(line)) is not None:
            after = None if last_sync is None else round(at - last_sync, 2)
            races.asks.append(Ask(member, after, match.group(1).strip()))
    return races


def run_races(directory: Path) -> Races:
    """Every worker log of one strategy's run directory."""
    races = Races()
    for log in sorted(directory.glob("w*.log")):
        with log.open(errors="replace") as lines:
            found = member_races(log.stem, lines)
        races.asks += found.asks
        races.stalls += found.stalls
    return races


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path,
                        help="a run directory (its strategy directories are read) or one "
                             "strategy's directory")
    args = parser.parse_args(argv)
    for run in args.runs:
        directories = [run] if any(run.glob("w*.log")) else sorted(
            d for d in run.iterdir() if d.is_dir() and any(d.glob("w*.log")))
        for directory in directories:
            races = run_races(directory)
            print(f"{directory}: {len(races.asks)} requests for a rebalance, "
                  f"{len(races.stalls)} stalled syncs")
            for ask in races.asks:
                after = "-" if ask.after_sync_s is None else f"{ask.after_sync_s:.2f}s"
                print(f"  ask   {ask.member}: {after} after its own sync: {ask.reason}")
            for stall in races.stalls:
                print(f"  stall {stall.member}: generation {stall.generation}, gave up its "
                      f"SyncGroup after {stall.waited_s:.2f}s")


if __name__ == "__main__":
    main()
