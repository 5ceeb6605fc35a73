"""The topology vocabulary shared with the Kafka Streams oracle: a topology in JSON (a list of
steps) built into a Relay app, with the same fixed functions the oracle interprets
(benchmarks/peers/kafka-streams/src/main/java/relay/peers/Oracle.java).

A topology is ``{"steps": [step, ...]}``; each step reads the step before it, or the step
whose index its ``"from"`` names. Keys and values are integers or None (tombstones); the
functions are total over them, so that both sides compute the same thing:

- ``filter {k, r}``: keep when the value is not None and ``value mod k == r``;
- ``map_values {a, b}``: ``a * value + b`` (None stays None);
- ``map {k}``: ``(value mod k, key)`` (a None value gives a None key);
- ``select_key {k}``, ``group_by {k}``: the key ``value mod k`` (None for a None value);
- ``flat_map {n}``: ``(key + i, value + i)`` for ``i < value mod n``; a None value gives
  ``(key, None)`` once;
- ``reduce {fn}`` and ``aggregate {init, fn}``: ``fn`` is ``sum`` or ``max`` (a None on
  either side gives the other: windowed aggregations see None values);
- ``join`` and ``left_join {table}``: ``value + table value``, or ``-1 - value`` without a
  table value;
- ``windowed_by {size, advance, grace}``: hopping windows (tumbling when advance == size);
  ``session_windowed_by {gap, grace}``, ``sliding_windowed_by {difference, grace}``; a session
  aggregation merges with ``fn`` too;
- ``to_table``: the stream as a table; ``filter`` and ``map_values`` of a table are the
  table's own (a row that stops passing is deleted);
- ``table_join {other, kind}`` (kind inner, left, outer), ``fk_join {other, k, kind}`` (the
  foreign key ``value mod k``; kind inner or left), ``stream_join {other, kind, before,
  after, grace}``: ``paired(left, right)``, the sum, ``-1 - left`` without a right value,
  ``-100 - right`` without a left one;
- ``table_group_by {k}``: ``(value mod k, value)``, then ``count``, or ``reduce`` and
  ``aggregate`` summing (adder ``+``, subtractor ``-``);
- ``suppress``: ``suppress(until_window_closes=True)`` of a windowed table.

``mod`` is the floor modulo (Python's ``%``, Java's ``Math.floorMod``). New operations add
steps here and in the oracle under new ``op`` names; a step never changes meaning.
"""

from __future__ import annotations

from typing import Any

from streams import App, HoppingWindows, JoinWindows, SessionWindows, SlidingWindows
from streams.dsl.stream import GroupedTable

Step = dict[str, Any]


def combine(fn: str, aggregate: Any, value: Any) -> Any:
    if aggregate is None or value is None:
        return value if aggregate is None else aggregate
    if fn == "sum":
        return aggregate + value
    if fn == "max":
        return max(aggregate, value)
    raise ValueError(f"unknown function {fn!r}")


def joined(value: Any, table_value: Any) -> Any:
    if value is None:
        return None
    return -1 - value if table_value is None else value + table_value


def paired(left: Any, right: Any) -> Any:
    if left is None:
        return None if right is None else -100 - right
    return -1 - left if right is None else left + right


def flat_mapped(key: Any, value: Any, n: int) -> list[tuple[Any, Any]]:
    if value is None:
        return [(key, None)]
    return [(None if key is None else key + i, value + i) for i in range(value % n)]


def _key_of(k: int) -> Any:
    return lambda _key, value: None if value is None else value % k


def build_app(topology: dict[str, Any], application_id: str = "differential") -> App:
    """The Relay app the JSON topology describes."""
    app = App(application_id, bootstrap_servers="127.0.0.1:1")
    built: dict[int, Any] = {}
    for i, step in enumerate(topology["steps"]):
        op = step["op"]
        up = built.get(step.get("from", i - 1))
        store = f"store-{i}"
        if op == "source":
            result = app.stream(step["topic"])
        elif op == "table":
            result = app.table(step["topic"], store=f"table-{i}")
        elif op == "filter":
            k, r = step["k"], step["r"]
            result = up.filter(lambda _key, v, k=k, r=r: v is not None and v % k == r)
        elif op == "map_values":
            a, b = step["a"], step["b"]
            result = up.map_values(lambda v, a=a, b=b: None if v is None else a * v + b)
        elif op == "map":
            k = step["k"]
            result = up.map(lambda key, v, k=k: (None if v is None else v % k, key))
        elif op == "select_key":
            result = up.select_key(_key_of(step["k"]))
        elif op == "flat_map":
            n = step["n"]
            result = up.flat_map(lambda key, v, n=n: flat_mapped(key, v, n))
        elif op == "group_by_key":
            result = up.group_by_key()
        elif op == "group_by":
            result = up.group_by(_key_of(step["k"]))
        elif op == "windowed_by":
            result = up.windowed_by(HoppingWindows(step["size"], step["advance"], step["grace"]))
        elif op == "session_windowed_by":
            result = up.windowed_by(SessionWindows(step["gap"], step["grace"]))
        elif op == "sliding_windowed_by":
            result = up.windowed_by(SlidingWindows(step["difference"], step["grace"]))
        elif op == "count":
            result = up.count(store=store)
        elif op in ("reduce", "aggregate") and isinstance(up, GroupedTable):
            if op == "reduce":
                result = up.reduce(lambda agg, v: agg + v, lambda agg, v: agg - v, store=store)
            else:
                result = up.aggregate(lambda init=step["init"]: init,
                                      lambda _key, v, agg: agg + v,
                                      lambda _key, v, agg: agg - v, store=store)
        elif op == "reduce":
            fn = step["fn"]
            result = up.reduce(lambda a, b, fn=fn: combine(fn, a, b), store=store)
        elif op == "aggregate":
            fn, init = step["fn"], step["init"]
            merger = {"merger": lambda _key, a, b, fn=fn: combine(fn, a, b)} if isinstance(
                getattr(up, "_windows", None), SessionWindows) else {}
            result = up.aggregate(lambda init=init: init,
                                  lambda _key, v, agg, fn=fn: combine(fn, agg, v), store=store,
                                  **merger)
        elif op == "to_table":
            result = up.to_table(store=f"to-table-{i}")
        elif op == "suppress":
            result = up.suppress(until_window_closes=True)
        elif op == "table_join":
            other, kind = built[step["other"]], step["kind"]
            result = {"inner": up.join, "left": up.left_join,
                      "outer": up.outer_join}[kind](other, paired)
        elif op == "fk_join":
            other, k = built[step["other"]], step["k"]
            join = up.join if step["kind"] == "inner" else up.left_join
            result = join(other, paired, foreign_key=lambda v, k=k: v % k)
        elif op == "table_group_by":
            k = step["k"]
            result = up.group_by(lambda _key, v, k=k: (v % k, v))
        elif op == "stream_join":
            other, kind = built[step["other"]], step["kind"]
            windows = JoinWindows(step["before"], step["after"], step["grace"])
            result = {"inner": up.join, "left": up.left_join,
                      "outer": up.outer_join}[kind](other, paired, windows)
        elif op == "to_stream":
            result = up.to_stream()
        elif op in ("join", "left_join"):
            table = built[step["table"]]
            result = getattr(up, op)(table, joined)
        elif op == "to":
            up.to(step["topic"])
            result = None
        else:
            raise ValueError(f"unknown op {op!r}")
        built[i] = result
    return app


def output_topics(topology: dict[str, Any]) -> list[str]:
    return [step["topic"] for step in topology["steps"] if step["op"] == "to"]

