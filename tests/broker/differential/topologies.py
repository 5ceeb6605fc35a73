"""Hypothesis strategies for the differential tests: random topologies of the DSL's
operations in the shared vocabulary (three families: streams with their aggregations and
windows, tables with their joins and re-groupings, stream-stream joins), and random input
records (keys, values, timestamps out of order, records late beyond the grace period,
tombstones)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

SOURCE = "in"
TABLE = "tbl"
OTHER_SOURCE = "in2"
OTHER_TABLE = "tbl2"

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
    kind = draw(st.sampled_from(["time", "time", "session", "sliding"]))
    grace = draw(st.sampled_from([0, 5, 20]))
    if kind == "session":
        return {"op": "session_windowed_by", "gap": draw(st.sampled_from([1, 5, 10, 20])),
                "grace": grace}
    if kind == "sliding":
        return {"op": "sliding_windowed_by",
                "difference": draw(st.sampled_from([1, 5, 10, 20])), "grace": grace}
    size = draw(st.sampled_from([5, 10, 20, 30]))
    advance = draw(st.sampled_from([d for d in (size, size // 2, 5) if 0 < d <= size]))
    return {"op": "windowed_by", "size": size, "advance": advance, "grace": grace}


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


def topologies(families: str = "streams,tables,stream-joins") -> st.SearchStrategy[dict[str, Any]]:
    """A topology of one of the three families, or of those ``families`` names (a
    comma-separated list of ``streams``, ``tables`` and ``stream-joins``)."""
    known = {"streams": _stream_topologies, "tables": _table_topologies,
             "stream-joins": _stream_join_topologies}
    names = [name.strip() for name in families.split(",") if name.strip()]
    unknown = sorted(set(names) - set(known))
    if unknown or not names:
        raise ValueError(f"unknown topology families {unknown or families!r}; "
                         f"choose among {sorted(known)}")
    return st.one_of(*(known[name]() for name in names))


@st.composite
def _stream_topologies(draw: st.DrawFn) -> dict[str, Any]:
    chain = _Chain()
    source = chain.add({"op": "source", "topic": SOURCE})
    table = chain.add({"op": "table", "topic": TABLE}) if draw(st.booleans()) else None
    chain.current = source
    for _ in range(draw(st.integers(1, 2))):
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
        # A windowed key is no number: a windowed aggregation comes last.
        windowed = draw(st.booleans())
        if windowed:
            chain.add(draw(_windows()))
        chain.add(draw(_aggregation))
        if windowed and draw(st.booleans()):
            chain.add({"op": "suppress"})
        chain.add({"op": "to_stream"})
        if windowed:
            # A windowed key is no number: only value operations may follow.
            for _ in range(draw(st.integers(0, 2))):
                chain.add(draw(_value_only))
            break
    chain.sink()
    return {"steps": chain.steps}


_table_grouped_aggregation = st.one_of(
    st.just({"op": "count"}),
    st.just({"op": "reduce", "fn": "sum"}),
    st.builds(lambda init: {"op": "aggregate", "fn": "sum", "init": init}, st.integers(-3, 3)),
)


@st.composite
def _table_topologies(draw: st.DrawFn) -> dict[str, Any]:
    """A table (read from a topic, or a stream made a table), its own filters and mappings,
    joined with another table on the key or by a foreign key, and re-grouped."""
    chain = _Chain()
    if draw(st.booleans()):
        chain.add({"op": "table", "topic": TABLE})
    else:
        chain.add({"op": "source", "topic": SOURCE})
        for _ in range(draw(st.integers(0, 2))):
            chain.add(draw(_stateless))
        chain.add({"op": "to_table"})
    other = None
    if draw(st.integers(0, 2)) > 0:
        at = chain.current
        other = chain.add({"op": "table", "topic": OTHER_TABLE})
        if draw(st.booleans()):
            other = chain.add(draw(_value_only))
        chain.current = at
    for _ in range(draw(st.integers(0, 3))):
        # One join with the other table at most: joined twice, the other table's updates
        # reach the second join by two paths (a diamond), where Kafka Streams counts a new
        # row twice downstream and Relay once (docs/kafka-streams.md, deliberate differences).
        if other is not None and draw(st.integers(0, 2)) == 0:
            joined, other = other, None
            if draw(st.booleans()):
                chain.add({"op": "table_join", "other": joined,
                           "kind": draw(st.sampled_from(["inner", "left", "outer"]))})
            else:
                chain.add({"op": "fk_join", "other": joined, "k": draw(st.integers(2, 5)),
                           "kind": draw(st.sampled_from(["inner", "left"]))})
        else:
            chain.add(draw(_value_only))
    table = chain.current
    if draw(st.booleans()):
        chain.add({"op": "to_stream"})
        chain.sink()
        chain.current = table
    if draw(st.booleans()) or not chain.sinks:
        chain.add({"op": "table_group_by", "k": draw(st.integers(1, 5))})
        chain.add(draw(_table_grouped_aggregation))
        if draw(st.booleans()):
            chain.add(draw(_value_only))
        chain.add({"op": "to_stream"})
        chain.sink()
    return {"steps": chain.steps}


@st.composite
def _stream_join_topologies(draw: st.DrawFn) -> dict[str, Any]:
    """Two streams joined within join windows, then stateless steps and maybe a count."""
    chain = _Chain()
    chain.add({"op": "source", "topic": SOURCE})
    for _ in range(draw(st.integers(0, 2))):
        chain.add(draw(_stateless))
    left = chain.current
    other = chain.add({"op": "source", "topic": OTHER_SOURCE})
    for _ in range(draw(st.integers(0, 1))):
        other = chain.add(draw(_stateless))
    before, after = draw(st.sampled_from([(0, 5), (5, 0), (5, 5), (2, 10), (10, 3), (1, 1)]))
    chain.add({"op": "stream_join", "other": other, "before": before, "after": after,
               "grace": draw(st.sampled_from([0, 3, 20])),
               "kind": draw(st.sampled_from(["inner", "left", "outer"]))}, reads=left)
    for _ in range(draw(st.integers(0, 2))):
        chain.add(draw(_stateless))
    if draw(st.booleans()):
        chain.sink()
        chain.add(draw(_grouping))
        chain.add(draw(_aggregation))
        chain.add({"op": "to_stream"})
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
