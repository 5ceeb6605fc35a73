"""Hypothesis strategies for the differential tests: random topologies of today's DSL
operations in the shared vocabulary, and random input records (keys, values, timestamps out
of order, records late beyond the grace period, tombstones)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

SOURCE = "in"
TABLE = "tbl"

_stateless = st.one_of(
    st.builds(lambda k, r: {"op": "filter", "k": k, "r": r % k},
              st.integers(1, 4), st.integers(0, 3)),
    st.builds(lambda a, b: {"op": "map_values", "a": a, "b": b},
              st.integers(-2, 3), st.integers(-5, 5)),
    st.builds(lambda k: {"op": "map", "k": k}, st.integers(1, 5)),
    st.builds(lambda k: {"op": "select_key", "k": k}, st.integers(1, 5)),
    st.builds(lambda n: {"op": "flat_map", "n": n}, st.integers(1, 4)),
)
_value_only = st.one_of(
    st.builds(lambda k, r: {"op": "filter", "k": k, "r": r % k},
              st.integers(1, 4), st.integers(0, 3)),
    st.builds(lambda a, b: {"op": "map_values", "a": a, "b": b},
              st.integers(-2, 3), st.integers(-5, 5)),
)
_grouping = st.one_of(
    st.just({"op": "group_by_key"}),
    st.builds(lambda k: {"op": "group_by", "k": k}, st.integers(1, 5)),
)
_aggregation = st.one_of(
    st.just({"op": "count"}),
    st.builds(lambda fn: {"op": "reduce", "fn": fn}, st.sampled_from(["sum", "max"])),
    st.builds(lambda fn, init: {"op": "aggregate", "fn": fn, "init": init},
              st.sampled_from(["sum", "max"]), st.integers(-3, 3)),
)


@st.composite
def _windows(draw: st.DrawFn) -> dict[str, Any]:
    size = draw(st.sampled_from([5, 10, 20, 30]))
    advance = draw(st.sampled_from([d for d in (size, size // 2, 5) if 0 < d <= size]))
    return {"op": "windowed_by", "size": size, "advance": advance,
            "grace": draw(st.sampled_from([0, 5, 20]))}


class _Chain:
    """Steps appended one after the other; ``add`` names the step read when it is not the
    one just before."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.current = -1
        self.sinks = 0

    def add(self, step: dict[str, Any], reads: int | None = None) -> int:
        reads = self.current if reads is None else reads
        if self.steps and reads != len(self.steps) - 1:
            step = {**step, "from": reads}
        self.steps.append(step)
        self.current = len(self.steps) - 1
        return self.current

    def sink(self, reads: int | None = None) -> None:
        at = self.current
        self.add({"op": "to", "topic": f"out-{self.sinks}"}, reads)
        self.sinks += 1
        self.current = at


@st.composite
def topologies(draw: st.DrawFn) -> dict[str, Any]:
    chain = _Chain()
    source = chain.add({"op": "source", "topic": SOURCE})
    table = chain.add({"op": "table", "topic": TABLE}) if draw(st.booleans()) else None
    chain.current = source
    for round_ in range(draw(st.integers(1, 2))):
        for _ in range(draw(st.integers(0, 3))):
            if table is not None and draw(st.integers(0, 3)) == 0:
                chain.add({"op": draw(st.sampled_from(["join", "left_join"])), "table": table})
            else:
                chain.add(draw(_stateless))
        if draw(st.integers(0, 4)) == 0:
            chain.sink()  # a side output of the stream before it is grouped
        if draw(st.integers(0, 4)) == 0:
            break  # a stateless topology
        chain.add(draw(_grouping))
        # Windows go by timestamps; after an aggregation those differ (see the test module).
        windowed = round_ == 0 and draw(st.booleans())
        if windowed:
            chain.add(draw(_windows()))
        chain.add(draw(_aggregation))
        chain.add({"op": "to_stream"})
        if windowed:
            # A windowed key is no number: only value operations may follow.
            for _ in range(draw(st.integers(0, 2))):
                chain.add(draw(_value_only))
            break
    chain.sink()
    return {"steps": chain.steps}


@st.composite
def records(draw: st.DrawFn, topology: dict[str, Any]) -> list[dict[str, Any]]:
    """Input records in time order with some out of order, some far enough behind to be late
    beyond a window's grace period; None keys and None values (tombstones) among them."""
    topics = [s["topic"] for s in topology["steps"] if s["op"] in ("source", "table")]
    keys = st.one_of(st.integers(0, 4), st.integers(0, 4), st.integers(0, 4), st.none())
    values = st.one_of(st.integers(-5, 20), st.integers(-5, 20), st.integers(-5, 20),
                       st.none())
    clock = 0
    out = []
    for _ in range(draw(st.integers(0, 25))):
        clock += draw(st.integers(0, 15))
        behind = draw(st.sampled_from([0, 0, 0, 0, 3, 12, 40]))
        out.append({
            "topic": draw(st.sampled_from(topics)),
            "key": draw(keys),
            "value": draw(values),
            "timestamp": max(0, clock - behind),
        })
    return out
