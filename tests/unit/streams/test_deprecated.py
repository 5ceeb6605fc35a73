"""Deprecated public names still work, and warn naming what replaces them."""

from __future__ import annotations

import pytest

from streams import App, TumblingWindows, Windowed
from streams.testing import TopologyTestDriver


def words_app() -> tuple[App, object]:
    app = App("deprecated-words")
    app.topic("lines", key_serde="str", value_serde="str")
    words = app.stream("lines").flat_map_values(str.split).group_by(lambda _key, word: word)
    return app, words


def test_table_map_warns_and_maps_the_tables_updates() -> None:
    app, words = words_app()
    per_minute = words.windowed_by(TumblingWindows(60_000)).count(store="words-per-minute")
    # The first README's app, as it was written when windowed counts were streams.
    with pytest.warns(DeprecationWarning, match=r"to_stream\(\)\.map\(fn\)") as caught:
        mapped = per_minute.map(lambda window, n: ([window.key, window.start], n))
    assert caught[0].filename == __file__
    mapped.to("words-per-minute")
    with TopologyTestDriver(app) as driver:
        driver.pipe("lines", None, "fig fig kiwi", timestamp_ms=1_000)
        driver.pipe("lines", None, "fig", timestamp_ms=61_000)
        assert driver.read_key_value_map("words-per-minute") == {
            ("fig", 0): 2, ("kiwi", 0): 1, ("fig", 60_000): 1}


def test_table_map_re_keys_so_a_later_aggregation_is_repartitioned() -> None:
    app, words = words_app()
    with pytest.warns(DeprecationWarning):
        by_length = words.count(store="counts").map(lambda word, n: (len(word), n))
    by_length.group_by_key().reduce(lambda total, n: total + n, store="by-length") \
        .to_stream().to("by-length")
    with TopologyTestDriver(app, partitions=2) as driver:
        driver.pipe("lines", None, "ab cd ab")
        # lines -> words (re-keyed by group_by) -> counts (re-keyed by map) -> by-length
        assert len(driver.subs) == 3
        # the count's updates ab=1, cd=1, ab=2 all land on length 2
        assert driver.store("by-length")[2] == 1 + 1 + 2


def test_table_to_warns_and_writes_the_tables_updates() -> None:
    app, words = words_app()
    totals = words.count(store="word-counts")
    windowed = words.windowed_by(TumblingWindows(60_000)).count(store="per-minute")
    with pytest.warns(DeprecationWarning, match=r"to_stream\(\)\.to\(topic\)"):
        totals.to("word-totals", value_serde="json")
    with pytest.warns(DeprecationWarning):
        windowed.to("per-minute")
    with TopologyTestDriver(app) as driver:
        driver.pipe("lines", None, "fig kiwi fig", timestamp_ms=1_000)
        assert driver.read_key_values("word-totals", value_serde="json") == [
            ("fig", 1), ("kiwi", 1), ("fig", 2)]
        assert driver.read_key_value_map("per-minute", key_serde="windowed") == {
            Windowed("fig", 0, 60_000): 2, Windowed("kiwi", 0, 60_000): 1}


def test_the_current_spelling_does_not_warn(recwarn: pytest.WarningsRecorder) -> None:
    _app, words = words_app()
    table = words.count(store="word-counts")
    table.to_stream().map(lambda word, n: (word, n)).to("mapped")
    table.to_stream().to("word-totals")
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]
