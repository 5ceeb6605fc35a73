"""Interactive queries on the real broker: two workers serve queries, and a key owned by one
is answered through the other (forwarded to its owner, found in the status topic) with the
count it was fed."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streams.queries.store_query import StoreUnavailable
from tests.broker.streams.harness import Launched, counting_app, counting_topics, tasks_of
from tests.conftest import wait_until

pytestmark = pytest.mark.broker


def fetch(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


async def test_a_key_owned_by_another_worker_is_answered_through_this_one(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str], launched: Launched
) -> None:
    app_id = unique("queries")
    source, sink, traffic = await counting_topics(bootstrap, app_id, records=340,
                                                  partitions=2)
    settings = {"query_port": 0, "query_host": "127.0.0.1"}
    first = counting_app(app_id, bootstrap, tmp_path / "first", source, sink, **settings)
    second = counting_app(app_id, bootstrap, tmp_path / "second", source, sink, **settings)
    launched.app(first)
    await wait_until(lambda: tasks_of(first) == {"0_0", "0_1"}, timeout_s=30,
                     message="the first worker running both tasks")
    launched.app(second)
    await wait_until(lambda: len(tasks_of(first)) == 1 and len(tasks_of(second)) == 1,
                     timeout_s=30, message="a task on each worker")
    assert first.query_server is not None and second.query_server is not None
    owned = tasks_of(second)
    key = next(f"k{i}" for i in range(traffic.keys)
               if second.store("counts").task_of(f"k{i}") in owned)
    expected = traffic.produced[key]
    url = f"{first.query_server.url}/stores/counts/{key}"
    answer: dict[str, Any] = {}

    async def answered_by_its_owner() -> bool:
        nonlocal answer
        code, answer = await asyncio.to_thread(fetch, url)
        return code == 200 and answer.get("value") == expected

    await wait_until(answered_by_its_owner, timeout_s=30,
                     message=f"{key}'s count of {expected} through the first worker")
    assert answer["owner"]["instance_id"] == second.instance_id
    assert answer["owner"]["endpoint"] == second.query_server.url
    assert answer["forwarded_by"] == first.query_server.url
    assert (answer["role"], answer["lag"], answer["task"]) == ("active", 0, next(iter(owned)))
    # In process: the owner reads it, the other worker says it is not here.
    assert second.store("counts").get(key) == expected
    with pytest.raises(StoreUnavailable) as refused:
        first.store("counts").get(key)
    assert refused.value.reason in ("not_local", "standby_only")
    code, body = await asyncio.to_thread(fetch, f"{first.query_server.url}/stores/nope/{key}")
    assert code == 404 and "unknown store 'nope'" in body["error"]
