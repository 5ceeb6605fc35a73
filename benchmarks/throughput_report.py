"""The throughput benchmark's figures, computed from what a worker reported, and its report:
the ratios between strategies, a Markdown table and a plot. No I/O but the plot's file.

A worker reports samples ``(records done, wall time, process CPU time)`` a few times a
second (:mod:`benchmarks.throughput_progress`). The steady figures are taken between two
shares of the input (:data:`WINDOW`), each crossing placed by linear interpolation between the
samples around it, so the join, the start-up and the tail are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The steady state: from this share of the input done to that one.
WINDOW = (0.2, 0.9)

Sample = tuple[int, float, float]


@dataclass(frozen=True)
class Figures:
    records_per_s_total: float | None
    records_per_s_steady: float | None
    cpu_us_per_record_steady: float | None
    first_output_s: float | None
    seconds_to_done: float | None
    #: From the first record done to the last: the start-up (the group join) left out.
    records_per_s_after_first: float | None


def crossing(samples: list[Sample], target: float) -> tuple[float, float] | None:
    """(wall, cpu) when the count reached ``target``, interpolated; None if it never did."""
    for i, (count, wall, cpu) in enumerate(samples):
        if count >= target:
            if i == 0:
                return wall, cpu
            before, wall0, cpu0 = samples[i - 1]
            share = (target - before) / (count - before)
            return wall0 + share * (wall - wall0), cpu0 + share * (cpu - cpu0)
    return None


def figures(samples: list[Sample], records: int, started: float) -> Figures:
    """What a run's samples say; ``started`` is the wall time the process was started."""
    # Interpolated like the steady window's ends, so a run shorter than a sampling tick
    # still has a duration.
    first, done = (None if at is None else at[0]
                   for at in (crossing(samples, 1), crossing(samples, records)))
    low, high = (crossing(samples, records * share) for share in WINDOW)
    steady = cpu = None
    if low is not None and high is not None and high[0] > low[0]:
        done_in_window = records * (WINDOW[1] - WINDOW[0])
        steady = done_in_window / (high[0] - low[0])
        cpu = (high[1] - low[1]) * 1e6 / done_in_window
    return Figures(
        records_per_s_total=None if done is None else records / max(1e-9, done - started),
        records_per_s_steady=steady,
        cpu_us_per_record_steady=cpu,
        first_output_s=None if first is None else first - started,
        seconds_to_done=None if done is None else done - started,
        records_per_s_after_first=None if done is None or first is None or done <= first
        else (records - 1) / (done - first),
    )


def ratios(results: list[dict[str, Any]], peers: tuple[str, ...],
           passthroughs: tuple[str, ...], java_peers: dict[str, str] | None = None,
           java_interval: str = "1s") -> list[dict[str, Any]]:
    """Relay at-least-once over the best Python peer and over the fastest passthrough, and
    exactly-once over at-least-once, at each commit interval that ran; Relay over Kafka
    Streams (``java_peers``: its strategy per processing guarantee) at the commit interval it
    ran with; by steady and by start-to-end throughput (each denominator the best by that
    figure)."""
    by_name = {r["strategy"]: r for r in results}

    def best(names: tuple[str, ...], figure: str) -> tuple[str | None, float | None]:
        values = [(by_name[n][figure], n) for n in names
                  if n in by_name and by_name[n].get(figure)]
        if not values:
            return None, None
        value, name = max(values)
        return name, value

    lines: list[dict[str, Any]] = []
    for interval in ("100ms", "1s"):
        alo, eos = f"relay-alo-{interval}", f"relay-eos-{interval}"
        pairs = [(alo, peers, "best Python peer"), (alo, passthroughs, "fastest passthrough"),
                 (eos, (alo,), "Relay at-least-once")]
        if java_peers and interval == java_interval:
            pairs += [(alo, (java_peers["at_least_once"],), "Kafka Streams"),
                      (eos, (java_peers["exactly_once"],), "Kafka Streams exactly-once")]
        for numerator, denominators, label in pairs:
            if numerator not in by_name:
                continue
            line: dict[str, Any] = {"numerator": numerator, "over": label}
            for figure in ("records_per_s_steady", "records_per_s_total"):
                name, value = best(denominators, figure)
                mine = by_name[numerator].get(figure)
                line[figure] = {"denominator": name,
                                "ratio": mine / value if mine and value else None}
            lines.append(line)
    return lines


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = ["| strategy | records/s start to end | records/s first output to end "
             "| records/s steady | CPU µs/record steady "
             "| CPU µs/record whole run | peak RSS MiB | first output s | counts | status |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        status = "ok" if not r.get("error") else "FAILED"
        lines.append(
            f"| {r['strategy']} | {_number(r.get('records_per_s_total'), ',.0f')} "
            f"| {_number(r.get('records_per_s_after_first'), ',.0f')} "
            f"| {_number(r.get('records_per_s_steady'), ',.0f')} "
            f"| {_number(r.get('cpu_us_per_record_steady'), '.1f')} "
            f"| {_number(r.get('cpu_us_per_record_total'), '.1f')} "
            f"| {_number(r.get('peak_rss_mib'), '.0f')} "
            f"| {_number(r.get('first_output_s'), '.2f')} "
            f"| {r.get('counts', '-')} | {status} |")
    failed = [r for r in results if r.get("error")]
    if failed:
        lines.append("")
    lines.extend(f"{r['strategy']} FAILED: {r['error']}" for r in failed)
    return lines


def ratio_lines(lines: list[dict[str, Any]]) -> list[str]:
    out = []
    for line in lines:
        parts = []
        for figure, label in (("records_per_s_steady", "steady"),
                              ("records_per_s_total", "start to end")):
            data = line[figure]
            ratio = "n/a" if data["ratio"] is None else f"{data['ratio']:.2f}"
            parts.append(f"{label} {ratio} (vs {data['denominator'] or '-'})")
        out.append(f"{line['numerator']} over {line['over']}: " + "; ".join(parts))
    return out


def plot(results: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["strategy"] for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.5 * len(names) + 2), sharey=True)
    for ax, figure, label in ((axes[0], "records_per_s_steady", "records/s (steady)"),
                              (axes[1], "cpu_us_per_record_steady",
                               "CPU µs per record (steady)")):
        values = [r.get(figure) or 0.0 for r in results]
        floor = min((v for v in values if v > 0), default=1.0) / 2
        colors = ["tab:gray" if r.get("error") else
                  "tab:blue" if r["strategy"].startswith("relay") else "tab:orange"
                  for r in results]
        ax.barh(names, values, color=colors)
        for y, (value, r) in enumerate(zip(values, results, strict=True)):
            text = "failed" if r.get("error") and not value else f"{value:,.0f}" \
                if figure.startswith("records") else f"{value:.1f}"
            ax.text(max(value, floor), y, f" {text}", va="center", fontsize=8)
        ax.set_xlabel(label)
        # The ceilings run orders of magnitude faster than the stateful apps (a log scale
        # needs a figure to scale: every strategy may have failed).
        if any(v > 0 for v in values):
            ax.set_xscale("log")
        else:
            ax.set_xlim(0, 1)
    # The axes share y: inverted once, the first strategy is on top in both.
    axes[0].invert_yaxis()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
