"""The scaling benchmark's plots: records processed per second over time, one panel per
strategy and state size from shortly before the first change, with each group change marked
(a dashed line where it starts, shading until the group is balanced again); and the longest
gap of a moved task against the state size, one panel per kind of change, one line per
strategy, in seconds and in join rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_throughput(results: list[dict[str, Any]], rate: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in results if r.get("throughput")]
    if not shown:
        return
    fig, axes = plt.subplots(len(shown), 1, figsize=(12, 3.4 * len(shown)), squeeze=False)
    # The start (catching up on the prefilled input) runs far above the steady rate; the
    # plot is about the steady rate, so the y axis is clipped and says so.
    top = rate * 2.5
    for ax, result in zip(axes[:, 0], shown, strict=True):
        series = result["throughput"]
        ax.plot(range(len(series)), series, linewidth=0.9, color="tab:blue",
                label="records processed per second")
        ax.axhline(rate, color="grey", linestyle=":", linewidth=0.8, label="input rate")
        for mark in result["marks"]:
            ax.axvline(mark["at_s"], color="tab:red", linestyle="--", linewidth=1.0)
            if mark["balanced_at_s"] is not None:
                ax.axvspan(mark["at_s"], mark["balanced_at_s"], color="tab:red", alpha=0.08)
            ax.text(mark["at_s"] + 0.5, top * 0.97, mark["label"], fontsize=8, va="top",
                    color="tab:red")
        ax.set_ylim(0, top)
        # From shortly before the first change: the start is the prefill's backlog, and the
        # strategies take very different times over it.
        first = min((mark["at_s"] for mark in result["marks"]), default=0.0)
        ax.set_xlim(max(0.0, first - 20), len(series))
        ax.set_xlabel("seconds since the strategy's workers started", fontsize=8)
        title = f"{result['strategy']}, {result.get('state_mb', 0):g} MB of state per task"
        if result.get("error"):
            title += f" (stopped: {result['error'][:80]})"
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("records/s (clipped)")
        ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: The changes whose moved tasks the gap plot shows (a rolling restart moves nothing).
GAP_KINDS = ("scale-out", "scale-in", "hand-over")


def plot_gaps_by_state(results: list[dict[str, Any]], round_s: float | None,
                       path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # (kind, strategy) -> [(state MB, gap s)], the first change of each kind in a run.
    points: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for result in results:
        seen: set[str] = set()
        for phase in result.get("phases", []):
            kind, gap = phase.get("kind"), phase.get("longest_gap_moved_s")
            if kind in GAP_KINDS and kind not in seen and gap is not None:
                seen.add(kind)
                points.setdefault((kind, result["strategy"]), []).append(
                    (result["state_mb"], gap))
    kinds = [k for k in GAP_KINDS if any(key[0] == k for key in points)]
    if not kinds:
        return
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        for (k, strategy), series in sorted(points.items()):
            if k != kind:
                continue
            series.sort()
            ax.plot([x for x, _ in series], [y for _, y in series], marker="o",
                    label=strategy)
        states = sorted({x for (k, _), series in points.items() if k == kind
                         for x, _ in series})
        ax.set_xticks(states, [f"{x:g}" for x in states])
        ax.set_xlabel("changelog per task at the start (MB)")
        ax.set_ylabel("longest gap of a moved task (s)")
        ax.set_ylim(bottom=0)
        ax.set_title(kind, fontsize=10)
        if round_s:
            rounds = ax.secondary_yaxis("right", functions=(lambda s: s / round_s,
                                                            lambda r: r * round_s))
            rounds.set_ylabel(f"join rounds (1 round = {round_s:.1f} s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
