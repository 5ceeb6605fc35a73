"""An App run without ``bootstrap_servers`` still starts an embedded broker of its own, for
this release, and says that this goes: a DeprecationWarning naming what to do instead (and a
logged warning, which a DeprecationWarning outside ``__main__`` is not by default)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from streams.app import App
from streams.config import ConfigError


@pytest.fixture(autouse=True)
def no_broker_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELAY_BOOTSTRAP_SERVERS", raising=False)


def unwritable_app(tmp_path: Path) -> App:
    (tmp_path / "a-file").write_text("not a directory")
    app = App("no-broker", state_dir=tmp_path / "a-file")
    app.stream("lines").to("copies")
    return app


def test_run_warns_at_the_callers_line_before_anything_starts(tmp_path: Path) -> None:
    app = unwritable_app(tmp_path)
    with (pytest.warns(DeprecationWarning, match="pass bootstrap_servers") as warned,
          pytest.raises(ConfigError, match="state_dir")):
        app.run()
    assert "relay broker" in str(warned[0].message)
    assert warned[0].filename == __file__


async def test_run_async_warns_once_per_app(tmp_path: Path) -> None:
    app = unwritable_app(tmp_path)
    with (pytest.warns(DeprecationWarning, match="relay broker"),
          pytest.raises(ConfigError, match="state_dir")):
        await app.run_async()
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        with pytest.raises(ConfigError, match="state_dir"):
            await app.run_async()
    assert not [w for w in again if issubclass(w.category, DeprecationWarning)]


def test_building_and_testing_an_app_needs_no_broker_and_warns_nothing(
    recwarn: pytest.WarningsRecorder,
) -> None:
    from streams.testing import TopologyTestDriver

    app = App("driven")
    app.stream("lines").group_by_key().count(store="counts").to_stream().to("totals")
    with TopologyTestDriver(app) as driver:
        driver.pipe("lines", "k", "a")
        assert driver.read_key_values("totals") == [("k", 1)]
    assert not [w for w in recwarn.list if issubclass(w.category, DeprecationWarning)
                and "bootstrap_servers" in str(w.message)]
