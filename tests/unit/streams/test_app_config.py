"""The app's one configuration: validated when the App is built (the assignor's settings
included), an explicit keyword signature, and a warning for misspelt environment variables."""

from __future__ import annotations

import inspect
import logging
import warnings
from dataclasses import fields
from pathlib import Path

import pytest

from streams.app import App
from streams.config import AppConfig, ConfigError
from streams.group.predecessors import MemberFiles


def test_an_assignor_setting_is_a_config_error_when_the_app_is_built() -> None:
    with pytest.raises(ConfigError, match="imbalance_tolerance must be >= 1"):
        App("a", bootstrap_servers="127.0.0.1:1", imbalance_tolerance=0)
    with pytest.raises(ConfigError, match="imbalance_tolerance"):
        AppConfig.from_env({"RELAY_IMBALANCE_TOLERANCE": "0"}, application_id="a")


def test_the_assignor_config_is_derived_from_the_app_config() -> None:
    config = AppConfig("a", num_standbys=1, acceptable_lag=5, max_learners=3,
                       lost_task_delay_ms=7, initial_delay_ms=8, scale_down_timeout_ms=9,
                       imbalance_tolerance=2)
    derived = config.assignor_config()
    assert (derived.num_standbys, derived.acceptable_lag, derived.max_learners,
            derived.lost_task_delay_ms, derived.initial_delay_ms,
            derived.scale_down_timeout_ms, derived.imbalance_tolerance) == (1, 5, 3, 7, 8, 9, 2)


def test_app_takes_every_setting_as_a_keyword() -> None:
    parameters = inspect.signature(App).parameters
    settings = {n for n, p in parameters.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    assert settings == {f.name for f in fields(AppConfig)}
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY
               for name, p in parameters.items()
               if name != "application_id" and name in settings)
    # A misspelt keyword names the setting meant; a TypeError too, as Python's own would be.
    with pytest.raises(ConfigError, match=r"App\(\) has no settings 'num_thread', 'zzz'; "
                                          r"did you mean num_threads\?$"):
        App("a", num_thread=2, zzz=1)
    with pytest.raises(TypeError):
        App("a", num_thread=2)


def test_a_misspelt_variable_gets_a_warning_naming_the_closest_setting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="streams.config"):
        config = AppConfig.from_env({"RELAY_NUM_THREAD": "4", "RELAY_TANSU_BIN": "/x",
                                     "RELAY_TEST_KAFKA": "1", "RELAY_KAFKA_CACHE": "/c"},
                                    application_id="a")
    assert config.num_threads == 1
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert "RELAY_NUM_THREAD" in messages[0] and "RELAY_NUM_THREADS" in messages[0]


def test_a_variable_the_app_overrides_gets_a_warning_that_it_is_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    environ = {"RELAY_NUM_STANDBYS": "-1", "RELAY_NUM_THREADS": "2",
               "RELAY_COMMIT_INTERVAL_MS": "500"}
    with caplog.at_level(logging.WARNING, logger="streams.config"):
        config = AppConfig.from_env(environ, application_id="a", num_standbys=1,
                                    num_threads=2)
    assert (config.num_standbys, config.num_threads, config.commit_interval_ms) == (1, 2, 500)
    assert [r.getMessage() for r in caplog.records] == [
        "environment variable RELAY_NUM_STANDBYS=-1 is ignored: the app sets num_standbys=1 "
        "itself (an argument wins over its variable)"]


def test_other_libraries_names_of_a_setting_lead_to_it() -> None:
    from streams.config import UnknownSettingError

    for name, meant in (("broker", "bootstrap_servers"), ("broker_address", "bootstrap_servers"),
                        ("group_id", "application_id"), ("num_stream_threads", "num_threads")):
        with pytest.raises(UnknownSettingError, match=f"did you mean {meant}\\?"):
            App("a", **{name: "x"})


def test_static_follower_digests_reads_booleans() -> None:
    with pytest.warns(DeprecationWarning, match="use broker_quirks"):
        assert AppConfig.from_env({"RELAY_STATIC_FOLLOWER_DIGESTS": "off"},
                                  application_id="a").static_follower_digests is False
    assert AppConfig("a").static_follower_digests is None
    with pytest.raises(ConfigError, match="static_follower_digests must be bool"):
        AppConfig.from_env({"RELAY_STATIC_FOLLOWER_DIGESTS": "maybe"}, application_id="a")


def test_static_follower_digests_warns_that_broker_quirks_replaces_it() -> None:
    with pytest.warns(DeprecationWarning, match="static_follower_digests is deprecated"):
        AppConfig("a", static_follower_digests=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AppConfig("a", broker_quirks="none")  # the replacement does not warn


def test_the_query_settings_are_checked_and_name_the_advertised_host() -> None:
    assert AppConfig("a").query_port is None
    with pytest.raises(ConfigError, match="query_port must be a port number"):
        AppConfig("a", query_port=70_000)
    with pytest.raises(ConfigError, match="query_port must be int"):
        AppConfig.from_env({"RELAY_QUERY_PORT": "eighty"}, application_id="a")
    with pytest.raises(ConfigError, match="query_host"):
        AppConfig("a", query_host="")
    assert AppConfig("a", query_port=0, query_host="127.0.0.1").query_endpoint_host == \
        "127.0.0.1"
    assert AppConfig("a", query_advertised_host="w1.internal").query_endpoint_host == \
        "w1.internal"
    assert AppConfig("a").query_endpoint_host not in ("", "0.0.0.0")


def test_the_changelog_buffer_is_a_size_in_bytes_from_a_keyword_or_the_environment() -> None:
    assert AppConfig("a").changelog_buffer_bytes == 10 * 1024 * 1024
    assert AppConfig.from_env({"RELAY_CHANGELOG_BUFFER_BYTES": "0"},
                              application_id="a").changelog_buffer_bytes == 0
    with pytest.raises(ConfigError, match="changelog_buffer_bytes must be >= 0"):
        App("a", bootstrap_servers="127.0.0.1:1", changelog_buffer_bytes=-1)
    with pytest.raises(ConfigError, match="changelog_buffer_bytes"):
        AppConfig.from_env({"RELAY_CHANGELOG_BUFFER_BYTES": "ten"}, application_id="a")


def test_the_repartition_purge_interval_is_kafka_streams_default_and_checked() -> None:
    assert AppConfig("a").repartition_purge_interval_ms == 30_000
    assert AppConfig.from_env({"RELAY_REPARTITION_PURGE_INTERVAL_MS": "0"},
                              application_id="a").repartition_purge_interval_ms == 0
    assert App("a", bootstrap_servers="127.0.0.1:1",
               repartition_purge_interval_ms=500).config.repartition_purge_interval_ms == 500
    with pytest.raises(ConfigError, match="repartition_purge_interval_ms must be >= 0, not -1"):
        App("a", bootstrap_servers="127.0.0.1:1", repartition_purge_interval_ms=-1)
    with pytest.raises(ConfigError, match="repartition_purge_interval_ms must be int"):
        AppConfig.from_env({"RELAY_REPARTITION_PURGE_INTERVAL_MS": "30s"}, application_id="a")


async def test_an_app_stopped_before_it_runs_does_not_start(tmp_path: Path) -> None:
    """stop() before run_async(): the run returns at once, without reaching for the broker
    (here an address nothing listens on, which a run would report as unreachable)."""
    app = App("stopped-early", bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
    app.stream("in").to("out")
    app.stop()
    await app.run_async()


async def test_a_second_process_of_an_app_on_its_state_directory_is_refused_at_once(
        tmp_path: Path) -> None:
    """Another live run holds the app's member files in this state directory: the run is a
    configuration error before it reaches for the broker (an address nothing listens on,
    which would be reported as unreachable), not a failure at the first store both open."""
    app = App("twice", bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
    app.stream("in").to("out")
    other_run = MemberFiles.claim(tmp_path, "twice", 1)
    try:
        with pytest.raises(ConfigError, match=r"another live process .*its own state_dir"):
            await app.run_async()
    finally:
        other_run.release()
    # The refused run kept nothing.
    MemberFiles.claim(tmp_path, "twice", 2).release()
