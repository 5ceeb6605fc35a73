"""A worker serves its Prometheus metrics on the real broker: scraped over HTTP, the figures
match what it was fed and what it runs."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.broker.streams.harness import counting_app, create_topics, produce, running
from tests.conftest import wait_until

pytestmark = pytest.mark.broker

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == w for k, w in labels.items()))


def input_lags(samples: Samples) -> dict[str, float]:
    """Each task's input lag, for the tasks that have one (a missing gauge is no 0)."""
    return {dict(labels)["task"]: value for (name, labels), value in samples.items()
            if name == "relay_task_input_lag_records"}


async def test_a_worker_serves_metrics_that_match_what_it_was_fed(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    app_id = unique("metrics")
    source, sink = f"{app_id}-in", f"{app_id}-out"
    records = 1_500
    await create_topics(bootstrap, {source: 3, sink: 1})
    await produce(bootstrap, source, [(f"k{i % 11}", i) for i in range(records)])

    app = counting_app(app_id, bootstrap, tmp_path, source, sink, metrics_port=0,
                       metrics_host="127.0.0.1")
    async with running(app):
        await wait_until(lambda: app.metrics_server is not None, timeout_s=30,
                         message="the metrics server")
        assert app.metrics_server is not None
        url = app.metrics_server.url
        samples: Samples = {}

        async def all_processed_and_committed() -> bool:
            nonlocal samples
            samples = await asyncio.to_thread(scrape, url)
            return (total(samples, "relay_records_processed_total") == records
                    and total(samples, "relay_commits_total") > 0
                    and input_lags(samples) == {"0_0": 0, "0_1": 0, "0_2": 0}
                    and bool(app.threads) and len(app.threads[0].tasks) == 3)

        await wait_until(all_processed_and_committed, timeout_s=90,
                         message="every record processed and committed, as scraped")
        thread = app.threads[0]
        label = thread.status_key.decode()
        running_tasks = sorted(thread.tasks)
        assert running_tasks == ["0_0", "0_1", "0_2"]
        assert total(samples, "relay_assigned_tasks", thread=label, role="active") == 3
        assert total(samples, "relay_assigned_tasks", thread=label, role="learner") == 0
        assert total(samples, "relay_assigned_tasks", thread=label, role="standby") == 0
        per_task = {t: total(samples, "relay_records_processed_total", thread=label, task=t)
                    for t in running_tasks}
        assert sum(per_task.values()) == records and all(n > 0 for n in per_task.values())
        assert total(samples, "relay_dead_letter_records_total") == 0
        assert total(samples, "relay_rebalances_total", thread=label) >= 1
        assert total(samples, "relay_restorations_total", thread=label) >= 3
        assert total(samples, "relay_process_loop_seconds_count", thread=label) >= 1
        assert total(samples, "relay_commit_seconds_count", thread=label) == \
            total(samples, "relay_commits_total", thread=label)
        assert ("relay_task_input_lag_records", (("task", "0_0"), ("thread", label))) in samples
    # Closed with the app: nothing listens there any more.
    assert app.metrics_server is None
    with pytest.raises(OSError):
        await asyncio.to_thread(scrape, url)
