"""The metrics recorder and its exposition: figures fed through the recorder API are scraped
back as Prometheus text over HTTP, from the server it starts and mounted in an aiohttp app."""

from __future__ import annotations

import asyncio
import logging
import math
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from streams.metrics import Metrics, MetricsServer, serve_metrics

T = "node-a-thread-0"


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as {(name, sorted labels): value}."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def scrape(server: MetricsServer) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return parse(r.read().decode())


@pytest.fixture
def served() -> Iterator[tuple[Metrics, MetricsServer]]:
    metrics = Metrics()
    server = serve_metrics(metrics, 0, "127.0.0.1")
    assert server is not None
    try:
        yield metrics, server
    finally:
        server.close()


def test_off_by_default() -> None:
    assert serve_metrics(Metrics(), None) is None


def test_scraped_figures_are_what_was_recorded(served: tuple[Metrics, MetricsServer]) -> None:
    metrics, server = served
    metrics.record_processed(T, "0_0", 120)
    metrics.record_processed(T, "0_0", 80)
    metrics.record_processed(T, "0_1", 7)
    metrics.record_dead_letters(T, "0_1")
    metrics.record_dead_letters(T, "0_1", 2)
    for seconds in (0.002, 0.004, 0.3):
        metrics.observe_loop(T, seconds)
    metrics.observe_commit(T, 0.02)
    metrics.observe_commit(T, 0.04)
    metrics.set_input_lag(T, "0_0", 1_500)
    metrics.set_copy_lag(T, "0_2", "learner", 9_000)
    metrics.set_restore_rate(T, "0_2", "learner", 25_000.5)
    metrics.set_copy_lag(T, "0_3", "standby", 12)
    metrics.finished_restoration(T, "0_2", 40_000, 1.6, 4_000_000)
    metrics.rebalance_done(T, 7.5, 0.25)
    metrics.rebalance_done(T, 6.0, 0.0)
    metrics.set_assignment(T, active=["0_0", "0_1"], learners=["0_2"], standbys=["0_3"])
    metrics.record_moved(T, "leaving", 2)
    metrics.record_moved(T, "learner_ready")
    metrics.set_hold_deadlines(T, {"0_5": 1_700_000_030_000})
    metrics.set_scale_down_deadline(T, 1_700_000_600_000)

    s = scrape(server)
    assert sample(s, "relay_records_processed_total", thread=T, task="0_0") == 200
    assert sample(s, "relay_records_processed_total", thread=T, task="0_1") == 7
    assert sample(s, "relay_dead_letter_records_total", thread=T, task="0_1") == 3
    assert sample(s, "relay_process_loop_seconds_count", thread=T) == 3
    assert math.isclose(sample(s, "relay_process_loop_seconds_sum", thread=T), 0.306)
    assert sample(s, "relay_process_loop_seconds_bucket", thread=T, le="0.005") == 2
    assert sample(s, "relay_commits_total", thread=T) == 2
    assert sample(s, "relay_commit_seconds_count", thread=T) == 2
    assert math.isclose(sample(s, "relay_commit_seconds_sum", thread=T), 0.06)
    assert sample(s, "relay_task_input_lag_records", thread=T, task="0_0") == 1_500
    assert sample(s, "relay_copy_changelog_lag_records", thread=T, task="0_2",
                  role="learner") == 9_000
    assert sample(s, "relay_copy_changelog_lag_records", thread=T, task="0_3",
                  role="standby") == 12
    assert sample(s, "relay_copy_restore_rate_records_per_second", thread=T, task="0_2",
                  role="learner") == 25_000.5
    assert sample(s, "relay_restorations_total", thread=T, task="0_2") == 1
    assert sample(s, "relay_restored_records_total", thread=T, task="0_2") == 40_000
    assert sample(s, "relay_restored_bytes_total", thread=T, task="0_2") == 4_000_000
    assert math.isclose(sample(s, "relay_restoration_seconds_sum", thread=T), 1.6)
    assert sample(s, "relay_rebalances_total", thread=T) == 2
    assert math.isclose(sample(s, "relay_rebalance_seconds_sum", thread=T), 13.5)
    assert math.isclose(sample(s, "relay_rebalance_revoked_seconds_sum", thread=T), 0.25)
    assert sample(s, "relay_assigned_tasks", thread=T, role="active") == 2
    assert sample(s, "relay_assigned_tasks", thread=T, role="learner") == 1
    assert sample(s, "relay_assigned_tasks", thread=T, role="standby") == 1
    assert sample(s, "relay_tasks_moved_total", thread=T, cause="leaving") == 2
    assert sample(s, "relay_tasks_moved_total", thread=T, cause="learner_ready") == 1
    assert sample(s, "relay_lost_task_hold_deadline_timestamp_seconds", thread=T,
                  task="0_5") == 1_700_000_030
    assert sample(s, "relay_scale_down_deadline_timestamp_seconds", thread=T) == 1_700_000_600


def test_names_follow_prometheus_conventions(served: tuple[Metrics, MetricsServer]) -> None:
    _, server = served
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families and all(name.startswith("relay_") for name in families)
    for family in families.values():
        if family.type == "counter":
            assert f"# TYPE {family.name}_total counter" in text or \
                f"# TYPE {family.name} counter" in text
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        if family.type in ("histogram", "gauge") and family.name != "relay_assigned_tasks":
            assert family.name.endswith(("_seconds", "_records", "_per_second",
                                         "_timestamp_seconds")), family.name


def test_only_metrics_is_served_and_another_path_says_where_they_are(
        served: tuple[Metrics, MetricsServer]) -> None:
    _, server = served
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics?x=1",
                                timeout=10) as r:
        assert r.status == 200 and b"relay_" in r.read()
    for path in ("/", "/metrics-typo", "/favicon.ico"):
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=10)
        assert missing.value.code == 404
        assert missing.value.read() == f"no metrics at {path}: they are at /metrics\n".encode()


def test_series_of_tasks_no_longer_held_disappear(served: tuple[Metrics, MetricsServer]) -> None:
    metrics, server = served
    metrics.set_input_lag(T, "0_0", 10)
    metrics.set_input_lag(T, "0_1", 20)
    metrics.set_copy_lag(T, "0_2", "learner", 30)
    metrics.set_hold_deadlines(T, {"0_5": 1_000, "0_6": 2_000})
    metrics.set_scale_down_deadline(T, 5_000)
    # The learner became the active; 0_1 moved away; one hold ended; the mark went.
    metrics.set_assignment(T, active=["0_0", "0_2"], learners=[], standbys=[])
    metrics.set_hold_deadlines(T, {"0_6": 2_000})
    metrics.set_scale_down_deadline(T, None)
    s = scrape(server)
    lags = {dict(k[1])["task"] for k in s if k[0] == "relay_task_input_lag_records"}
    assert lags == {"0_0"}
    assert not [k for k in s if k[0] == "relay_copy_changelog_lag_records"]
    holds = {dict(k[1])["task"] for k in s
             if k[0] == "relay_lost_task_hold_deadline_timestamp_seconds"}
    assert holds == {"0_6"}
    assert not [k for k in s if k[0] == "relay_scale_down_deadline_timestamp_seconds"]
    assert sample(s, "relay_assigned_tasks", thread=T, role="learner") == 0


def test_wrong_figures_are_dropped_and_logged_once(
    served: tuple[Metrics, MetricsServer], caplog: pytest.LogCaptureFixture
) -> None:
    metrics, server = served
    metrics.record_processed(T, "0_0", 5)
    with caplog.at_level(logging.WARNING, logger="streams.metrics"):
        metrics.record_processed(T, "0_0", -3)
        metrics.record_processed(T, "0_0", -4)
        metrics.observe_commit(T, float("nan"))
        metrics.set_copy_lag(T, "0_2", "owner", 5)
        metrics.record_moved(T, "boredom")
    s = scrape(server)
    assert sample(s, "relay_records_processed_total", thread=T, task="0_0") == 5
    assert not [k for k in s if k[0] == "relay_commits_total"]
    assert not [k for k in s if k[0] == "relay_copy_changelog_lag_records"]
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "metrics: dropped a figure for records processed: -3 is not a count (reported once)",
        "metrics: dropped a figure for commit latency: nan is not a non-negative number "
        "(reported once)",
        "metrics: dropped a figure for copy lag: 'owner' is none of learner, standby "
        "(reported once)",
        "metrics: dropped a figure for tasks moved: 'boredom' is none of learner_ready, "
        "leaving, scale_down_timeout, lost, balance (reported once)",
    ]


def test_two_apps_in_one_process_keep_their_own_figures() -> None:
    first, second = Metrics(), Metrics()
    first.record_processed(T, "0_0", 3)
    second.record_processed(T, "0_0", 4)
    assert sample(parse(first.exposition().decode()), "relay_records_processed_total",
                  thread=T, task="0_0") == 3
    assert sample(parse(second.exposition().decode()), "relay_records_processed_total",
                  thread=T, task="0_0") == 4


async def test_mounted_in_a_users_aiohttp_server() -> None:
    metrics = Metrics()
    metrics.record_processed(T, "1_3", 42)
    app = web.Application()
    app.router.add_get("/metrics", metrics.aiohttp_handler())
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/metrics")
        assert response.status == 200
        s = parse(await response.text())
    assert sample(s, "relay_records_processed_total", thread=T, task="1_3") == 42


async def test_mounted_as_an_asgi_app() -> None:
    metrics = Metrics()
    metrics.observe_commit(T, 0.5)
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "query_string": b"",
             "headers": [], "asgi": {"version": "3.0"}}
    await asyncio.wait_for(metrics.asgi_app()(scope, receive, send), 10)
    assert sent[0]["status"] == 200
    body = b"".join(m.get("body", b"") for m in sent[1:]).decode()
    assert sample(parse(body), "relay_commits_total", thread=T) == 1


def test_a_taken_port_names_the_setting(served: tuple[Metrics, MetricsServer]) -> None:
    _, server = served
    with pytest.raises(OSError, match=rf"cannot serve metrics on 127.0.0.1:{server.port} "
                                      r"\(metrics_port\)"):
        serve_metrics(Metrics(), server.port, "127.0.0.1")
