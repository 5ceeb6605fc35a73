"""The serdes round-trip, and the ordered key encoding sorts like the keys it encodes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statestore.serdes import (
    JsonSerde,
    MsgPackSerde,
    OrderedKeySerde,
    SerdeError,
    StrSerde,
    serde_from_name,
)

ordered = OrderedKeySerde()
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
scalars = st.one_of(st.text(), st.binary(), ints)


@given(st.one_of(scalars, st.tuples(scalars, ints), st.none(), st.booleans()))
def test_ordered_round_trip(value: object) -> None:
    assert ordered.loads(ordered.dumps(value)) == value


@given(st.text(), st.text())
def test_ordered_strings_sort_like_strings(a: str, b: str) -> None:
    assert (ordered.dumps(a) < ordered.dumps(b)) == (a.encode() < b.encode())


@given(ints, ints)
def test_ordered_ints_sort_like_ints(a: int, b: int) -> None:
    assert (ordered.dumps(a) < ordered.dumps(b)) == (a < b)


@given(st.floats(allow_nan=False), st.floats(allow_nan=False))
def test_ordered_floats_sort_like_floats(a: float, b: float) -> None:
    if a == b:
        return
    assert (ordered.dumps(a) < ordered.dumps(b)) == (a < b)


@given(st.tuples(st.text(), ints), st.tuples(st.text(), ints))
def test_ordered_tuples_sort_by_elements(a: tuple, b: tuple) -> None:
    as_bytes = (a[0].encode(), a[1]), (b[0].encode(), b[1])
    assert (ordered.dumps(a) < ordered.dumps(b)) == (as_bytes[0] < as_bytes[1])


@given(st.text(), st.text())
def test_ordered_prefix_matches_exactly_the_keys_it_starts(prefix: str, key: str) -> None:
    assert ordered.dumps(key).startswith(ordered.prefix(prefix)) == key.startswith(prefix)


@pytest.mark.parametrize("bad", [b"", b"\x99", b"\x20abc", b"\x10\x00", b"\x20a\x00\x07"])
def test_ordered_rejects_garbage(bad: bytes) -> None:
    with pytest.raises(SerdeError):
        ordered.loads(bad)


def test_ordered_rejects_unsupported_key_types() -> None:
    with pytest.raises(SerdeError, match="store keys must be"):
        ordered.dumps({"a": 1})
    with pytest.raises(SerdeError, match="64 bits"):
        ordered.dumps(2**70)


def test_value_serdes_round_trip_and_reject_garbage() -> None:
    for serde, value in [(MsgPackSerde(), {"a": [1, 2]}), (JsonSerde(), {"a": [1, 2]})]:
        assert serde.loads(serde.dumps(value)) == value
    with pytest.raises(SerdeError):
        MsgPackSerde().loads(b"\xc1")
    with pytest.raises(SerdeError):
        JsonSerde().loads(b"{nope")
    with pytest.raises(SerdeError):
        StrSerde().loads(b"\xff\xfe")


def test_serde_from_name() -> None:
    assert isinstance(serde_from_name("json"), JsonSerde)
    with pytest.raises(ValueError, match="unknown serde 'yaml'"):
        serde_from_name("yaml")
    with pytest.raises(ValueError, match="is not a serde"):
        serde_from_name(object())  # type: ignore[arg-type]


def test_windowed_keys_round_trip_through_msgpack_and_json() -> None:
    from streams.dsl.windows import Windowed, WindowedSerde

    key = Windowed(("user", 7), 60_000, 120_000)
    for inner in ("msgpack", "json"):
        serde = WindowedSerde(inner)
        assert serde.loads(serde.dumps(key)) == key
    assert serde_from_name("windowed").dumps(Windowed("k", 0, 10)) == MsgPackSerde().dumps(
        ["k", 0, 10])
    with pytest.raises(SerdeError, match="not a windowed key"):
        WindowedSerde().loads(MsgPackSerde().dumps("plain"))
    with pytest.raises(SerdeError, match="takes Windowed keys"):
        WindowedSerde().dumps("plain")
