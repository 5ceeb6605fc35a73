"""Interactive queries over HTTP, without a broker: two workers' query services on real local
servers over the same stores (each holding some of the tasks), and a router holding none.
A key is answered where its task runs, forwarded there once from anywhere else, and refused
with a reason (4xx) or a retry (503 with Retry-After) otherwise."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from streams import App
from streams.group.partition_assignor import TaskLayout
from streams.queries import server
from streams.queries.routing import RoutingTable, StatusFollower
from streams.queries.server import FORWARDED_HEADER, QueryService, make_query_app
from streams.queries.store_layout import store_layouts
from streams.queries.store_query import LocalStores, StoreUnavailable
from streams.runtime.transitions import Role
from streams.testing import TopologyTestDriver
from tests.unit.streams.test_queries import FakeThread, word_count_app


@dataclass
class Worker:
    name: str
    thread: FakeThread
    table: RoutingTable
    client: TestClient

    @property
    def url(self) -> str:
        return str(self.client.make_url("")).rstrip("/")


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[TopologyTestDriver]:
    with TopologyTestDriver(word_count_app(), partitions=4, state_dir=tmp_path) as d:
        for n, line in enumerate(["apple pear fig", "kiwi plum lime", "date grape melon",
                                  "apple fig fig"]):
            d.pipe("lines", f"line-{n}", line)
        d.commit()
        yield d


def status(worker: Worker, driver: TopologyTestDriver, **fields: Any) -> dict[str, Any]:
    record = {
        "instance_id": worker.name, "thread": 0, "updated_ms": int(time.time() * 1000),
        "active": sorted(worker.thread.registry.active), "restoring": [], "standbys": {},
        "learners": {}, "query_endpoint": worker.url,
        "stores": {n: s.to_status() for n, s in store_layouts(driver.subs).items()},
    }
    record.update(fields)
    return record


@pytest.fixture
async def workers(driver: TopologyTestDriver) -> AsyncIterator[tuple[Worker, Worker]]:
    """Worker a runs the even counting tasks, worker b the odd ones."""
    layout = TaskLayout(tuple(driver.subs))
    made: list[Worker] = []
    for name, parity in (("a", 0), ("b", 1)):
        thread = FakeThread(f"{name}-thread-0", layout)
        for task_id, task in driver.tasks.items():
            if task_id.startswith("1_") and int(task_id[2:]) % 2 == parity:
                thread.registry.add_running(task)
        table = RoutingTable()
        local = LocalStores(lambda thread=thread: [thread])  # type: ignore[misc]
        holder: list[Worker] = []
        service = QueryService(table, local, instance_id=name,
                               endpoint=lambda holder=holder: holder[0].url)
        client = TestClient(TestServer(make_query_app(service)))
        await client.start_server()
        worker = Worker(name, thread, table, client)
        holder.append(worker)
        made.append(worker)
    a, b = made
    for worker in made:
        for member in made:
            worker.table.apply(f"{member.name}-thread-0", status(member, driver),
                               int(time.time() * 1000))
    try:
        yield a, b
    finally:
        for worker in made:
            await worker.client.close()


def task_of(driver: TopologyTestDriver, word: str) -> str:
    return store_layouts(driver.subs)["word-counts"].task_of(word)


def word_on(driver: TopologyTestDriver, worker: Worker) -> str:
    for word in ("apple", "pear", "fig", "kiwi", "plum", "lime", "date", "grape", "melon"):
        if task_of(driver, word) in worker.thread.registry.active:
            return word
    raise AssertionError(f"no word on {worker.name}")


async def get(worker: Worker, path: str, **headers: str) -> tuple[int, dict[str, Any], Any]:
    response = await worker.client.get(path, headers=headers)
    return response.status, await response.json(), response.headers


async def test_a_key_is_answered_where_it_runs_and_forwarded_there_from_elsewhere(
        driver: TopologyTestDriver, workers: tuple[Worker, Worker]) -> None:
    a, b = workers
    counts = {"apple": 2, "fig": 3, "pear": 1, "kiwi": 1, "plum": 1, "lime": 1, "date": 1,
              "grape": 1, "melon": 1}
    for word, count in counts.items():
        for asked in (a, b):
            code, body, _ = await get(asked, f"/stores/word-counts/{word}")
            owner = a if task_of(driver, word) in a.thread.registry.active else b
            assert code == 200, body
            assert (body["value"], body["role"], body["lag"]) == (count, "active", 0)
            assert body["task"] == task_of(driver, word)
            assert body["partition"] == int(body["task"].split("_")[1])
            assert body["owner"] == {"member": f"{owner.name}-thread-0",
                                     "instance_id": owner.name, "endpoint": owner.url}
            assert ("forwarded_by" in body) == (asked is not owner)


async def test_a_missing_key_is_a_404_that_says_who_answered(
        driver: TopologyTestDriver, workers: tuple[Worker, Worker]) -> None:
    a, _ = workers
    code, body, _ = await get(a, "/stores/word-counts/no-such-word")
    assert code == 404 and body["found"] is False and body["value"] is None
    assert body["role"] == "active" and body["owner"]["instance_id"] in ("a", "b")
    # It may have been counted on another partition, by a producer with another partitioner.
    assert body["reason"] == "not_found"
    assert f"partition {body['partition']}" in body["hint"] and "murmur2" in body["hint"]


async def test_bad_requests_get_a_4xx_with_a_message(
        driver: TopologyTestDriver, workers: tuple[Worker, Worker]) -> None:
    a, _ = workers
    cases = {
        "/stores/nope/fig": (404, "unknown store 'nope' (stores: word-counts)"),
        "/stores/word-counts/fig?key_format=xml": (400, "key_format must be one of"),
        "/stores/word-counts/%7Bnot-json?key_format=json": (400, "is not valid JSON"),
        "/stores/word-counts/fig?allow_standby=maybe": (400, "allow_standby must be"),
        "/stores/word-counts/fig?max_lag=-3": (400, "max_lag must be"),
        "/stores/word-counts/fig?colour=red": (400, "unknown parameter(s) colour"),
        "/stores/word-counts/%7B%22a%22%3A%201%7D?key_format=json": (400, "cannot encode"),
        "/stores/word-counts": (404, "GET /stores/<store>/<key>"),
    }
    for path, (expected, message) in cases.items():
        code, body, _ = await get(a, path)
        assert code == expected, (path, body)
        assert message in body["error"], (path, body)
    response = await a.client.post("/stores/word-counts/fig")
    assert response.status == 405 and "error" in await response.json()


async def test_a_key_is_read_alike_by_every_worker_whatever_its_escapes(
        driver: TopologyTestDriver, workers: tuple[Worker, Worker]) -> None:
    """A path is sent as typed (lower-case escapes kept): the worker that forwards it and the
    owner that answers must read the same key from it."""
    a, b = workers
    driver.pipe("lines", "line-x", "café %ff a/b")
    driver.commit()
    for raw, key in (("caf%c3%a9", "café"), ("%25ff", "%ff"), ("a%2fb", "a/b")):
        for asked in (a, b):
            response = await asked.client.get(URL(f"/stores/word-counts/{raw}", encoded=True))
            body = await response.json()
            assert (response.status, body["key"], body["value"]) == (200, key, 1), (raw, body)
    for asked in (a, b):
        response = await asked.client.get(URL("/stores/word-counts/%ff%fe", encoded=True))
        body = await response.json()
        assert response.status == 400, body
        assert "'%ff%fe' is not UTF-8" in body["error"] and "key_format=json" in body["error"]


async def test_a_json_key_reaches_the_task_of_that_key(
        driver: TopologyTestDriver, workers: tuple[Worker, Worker]) -> None:
    a, _ = workers
    code, body, _ = await get(a, '/stores/word-counts/"fig"?key_format=json')
    assert code == 200 and body["value"] == 3


async def test_a_key_nobody_can_answer_now_is_a_503_with_retry_after(
        driver: TopologyTestDriver, workers: tuple[Worker, Worker]) -> None:
    a, b = workers
    word = word_on(driver, b)
    task = task_of(driver, word)
    now = int(time.time() * 1000)
    # b restores the task: a refuses rather than answering from anywhere else.
    a.table.apply("b-thread-0", status(b, driver, active=[], restoring=[task]), now)
    code, body, headers = await get(a, f"/stores/word-counts/{word}")
    assert (code, body["reason"], body["task"]) == (503, "restoring", task)
    assert headers["Retry-After"] == "1" and "retry" in body["error"]
    # Nobody holds it.
    a.table.apply("b-thread-0", None, now)
    code, body, _ = await get(a, f"/stores/word-counts/{word}")
    assert (code, body["reason"]) == (503, "no_owner")
    # b's record is stale: it is not routed to.
    a.table.apply("b-thread-0", status(b, driver, updated_ms=now - 60_000), now)
    code, body, _ = await get(a, f"/stores/word-counts/{word}")
    assert (code, body["reason"]) == (503, "no_owner")
    # b's endpoint does not answer.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    a.table.apply("b-thread-0", status(b, driver, query_endpoint=dead), now)
    code, body, _ = await get(a, f"/stores/word-counts/{word}")
    assert (code, body["reason"]) == (503, "owner_unreachable")
    assert dead in body["error"]


async def test_an_owner_that_does_not_answer_is_named_with_the_copy_that_could(
        driver: TopologyTestDriver, workers: tuple[Worker, Worker],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A frozen owner (SIGSTOP) accepts the connection and says nothing: the answer says it
    did not answer in time, and where a copy could answer with allow_standby=true."""
    monkeypatch.setattr(server, "FORWARD_TIMEOUT_S", 0.005)
    a, b = workers
    word = word_on(driver, b)
    task = task_of(driver, word)
    now = int(time.time() * 1000)
    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen()  # connections wait in the backlog, never answered
        endpoint = f"http://127.0.0.1:{frozen.getsockname()[1]}"
        a.table.apply("b-thread-0", status(b, driver, query_endpoint=endpoint), now)
        a.table.apply("c-thread-0", status(b, driver, active=[], standbys={task: 3},
                                           instance_id="c"), now)
        code, body, _ = await get(a, f"/stores/word-counts/{word}")
    assert (code, body["reason"]) == (503, "owner_unreachable")
    assert f"({'b-thread-0'} at {endpoint}) did not answer within 0.005 s; retry" in body["error"]
    assert body["error"].endswith(
        "or read the standby copy on c-thread-0 (lag 3) with allow_standby=true")


async def test_a_forwarded_request_is_never_forwarded_again(
        driver: TopologyTestDriver, workers: tuple[Worker, Worker]) -> None:
    a, b = workers
    word = word_on(driver, b)
    code, body, headers = await get(a, f"/stores/word-counts/{word}",
                                    **{FORWARDED_HEADER: b.url})
    assert (code, body["reason"]) == (503, "not_local")
    assert "Retry-After" in headers


async def test_a_standby_answers_only_when_allowed_with_its_lag(
        driver: TopologyTestDriver, workers: tuple[Worker, Worker]) -> None:
    a, b = workers
    word = word_on(driver, b)
    task = task_of(driver, word)
    # a follows b's task as a standby, 5 records behind; b is gone from the group.
    a.thread.registry.add_copy(task, Role.STANDBY, driver.tasks[task].stores)
    a.thread.state_updater.copy_lag = lambda t: 5 if t == task else 2**31 - 1
    a.table.apply("b-thread-0", None, int(time.time() * 1000))
    code, body, _ = await get(a, f"/stores/word-counts/{word}")
    assert (code, body["reason"]) == (503, "standby_only")
    assert "allow_standby" in body["error"]
    code, body, _ = await get(a, f"/stores/word-counts/{word}?allow_standby=true")
    assert code == 200 and (body["role"], body["lag"]) == ("standby", 5)
    assert body["owner"]["instance_id"] == "a"
    code, body, _ = await get(a, f"/stores/word-counts/{word}?allow_standby=1&max_lag=2")
    assert (code, body["reason"]) == (503, "too_far_behind")


async def test_a_router_without_stores_forwards_every_key_to_its_owner(
        driver: TopologyTestDriver, workers: tuple[Worker, Worker]) -> None:
    a, b = workers
    table = RoutingTable()
    for worker in workers:
        table.apply(f"{worker.name}-thread-0", status(worker, driver), int(time.time() * 1000))
    async with TestClient(TestServer(make_query_app(QueryService(table)))) as router:
        for word, count in (("fig", 3), ("apple", 2), ("melon", 1)):
            response = await router.get(f"/stores/word-counts/{word}")
            body = await response.json()
            owner = a if task_of(driver, word) in a.thread.registry.active else b
            assert response.status == 200 and body["value"] == count
            assert body["owner"]["endpoint"] == owner.url
            assert body["forwarded_by"] == "relay-web"
        response = await router.get("/stores/other/fig")
        assert response.status == 404


def test_the_status_follower_decodes_records_and_tombstones() -> None:
    import msgpack

    table = RoutingTable()
    follower = StatusFollower("127.0.0.1:1", "app", table)
    record = {"instance_id": "x", "active": ["1_0"], "query_endpoint": "http://h:1",
              "updated_ms": int(time.time() * 1000)}
    follower.apply(b"x-thread-0", msgpack.packb(record))
    follower.apply(b"y-thread-0", b"\xc1not msgpack")
    routes = table.routes("1_0", int(time.time() * 1000))
    assert [(r.member, r.role, r.endpoint) for r in routes] == [
        ("x-thread-0", "active", "http://h:1")]
    assert table.rejected == 1 and "y-thread-0" in (table.last_rejection or "")
    follower.apply(b"x-thread-0", None)
    assert table.routes("1_0", int(time.time() * 1000)) == []


async def test_a_query_port_in_use_is_an_error_naming_the_setting() -> None:
    from streams.queries.server import QueryServer

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = QueryServer(QueryService(RoutingTable()))
        with pytest.raises(OSError, match=f"cannot serve queries on 127.0.0.1:{port} "
                                          r"\(query_port\)"):
            await server.start("127.0.0.1", port, "127.0.0.1")
        await server.close()
    server = QueryServer(QueryService(RoutingTable()))
    url = await server.start("127.0.0.1", 0, "worker-7.internal")
    try:
        assert url.startswith("http://worker-7.internal:") and not url.endswith(":0")
    finally:
        await server.close()


async def test_a_malformed_request_is_a_400_and_one_warning_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request aiohttp cannot parse (a header line without a colon) is the client's
    mistake: a 400, one warning line without a traceback, and the server answers on."""
    from streams.queries.server import QueryServer

    server = QueryServer(QueryService(RoutingTable()))
    url = await server.start("127.0.0.1", 0, "127.0.0.1")
    port = int(url.rsplit(":", 1)[1].rstrip("/"))

    async def exchange(request: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        answer = await reader.read(200)
        writer.close()
        return answer

    try:
        with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
            answer = await exchange(b"GET /stores/x/1 HTTP/1.1\r\nno colon here\r\n\r\n")
        assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request")
        logged = [r for r in caplog.records if r.name == "aiohttp.server"]
        assert [(r.levelno, r.exc_info) for r in logged] == [(logging.WARNING, None)]
        said = logged[0].getMessage()
        assert said.startswith("bad HTTP request from 127.0.0.1: Invalid header token")
        assert "\n" not in said
        answer = await exchange(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.split(b"\r\n")[0].endswith(b" 404 Not Found")
    finally:
        await server.close()


async def test_a_global_tables_keys_are_answered_by_any_process_that_holds_it(
        tmp_path: Path) -> None:
    app = App("global-queries", bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
    app.topic("rates", key_serde="str", value_serde="json")
    rates = app.global_table("rates", store="rates")
    app.stream("payments").left_join(rates, lambda _k, v: v["currency"],
                                     lambda p, r: [p, r]).to("out")
    unopened = app.store("rates")
    with pytest.raises(StoreUnavailable, match="global table rates is not open here"):
        unopened.get("EUR")
    with TopologyTestDriver(app, state_dir=tmp_path / "driver") as driver:
        driver.pipe("rates", "EUR", {"usd": 1.1})
        driver.pipe("rates", "GBP", {"usd": 1.3})
        assert driver.store("rates").to_dict() == {"EUR": {"usd": 1.1}, "GBP": {"usd": 1.3}}
        # What the driver opened is what a running app's process holds: all of the table.
        assert rates.opened is not None
        rates.opened.commit()
        store = app.store("rates")
        assert store.get("EUR") == {"usd": 1.1} and store.get("JPY", "none") == "none"
        assert store.range("A", "F").entries == [("EUR", {"usd": 1.1})]
        service = QueryService(RoutingTable(), app.local_stores, instance_id="w1")
        async with TestClient(TestServer(make_query_app(service))) as client:
            found = await client.get("/stores/rates/GBP")
            body = await found.json()
            assert found.status == 200 and body["value"] == {"usd": 1.3}
            assert (body["task"], body["role"]) == ("global", "global")
            missing = await client.get("/stores/rates/JPY")
            assert missing.status == 404
            assert "every instance holds whole" in (await missing.json())["hint"]


async def test_a_keys_windows_and_sessions_are_fetched_over_http(tmp_path: Path) -> None:
    """A windowed or session store asked for a record key (or with from/to) answers the
    key's windows, oldest first, as Kafka Streams' WindowStore.fetch and SessionStore.fetch
    do; one window is still read by its [key, start]."""
    from streams.dsl.sessions import SessionWindows
    from streams.dsl.windows import TumblingWindows
    from streams.queries.store_query import StoreQuery

    app = App("fetch-queries", bootstrap_servers="127.0.0.1:1")
    grouped = app.stream("clicks").group_by_key()
    grouped.windowed_by(TumblingWindows(1000, grace_ms=5_000)).count(store="per-second")
    grouped.windowed_by(SessionWindows(inactivity_gap_ms=100, grace_ms=5_000)).count(
        store="visits")
    grouped.count(store="totals")
    with TopologyTestDriver(app, partitions=2, state_dir=tmp_path) as d:
        for t in (100, 200, 1_100, 2_500, 2_550):
            d.pipe("clicks", "ann", 1, timestamp_ms=t)
        d.pipe("clicks", "bob", 1, timestamp_ms=300)
        d.commit()
        thread = FakeThread("a-thread-0", TaskLayout(tuple(d.subs)))
        for task in d.tasks.values():
            thread.registry.add_running(task)
        local = LocalStores(lambda: [thread])  # type: ignore[list-item]
        fetched = StoreQuery("per-second", local).fetch("ann", 1_000, 2_000)
        assert fetched.windows == [{"start": 1_000, "value": 1}, {"start": 2_000, "value": 2}]
        service = QueryService(RoutingTable(), local, instance_id="a")
        async with TestClient(TestServer(make_query_app(service))) as client:
            async def get(path: str) -> tuple[int, Any]:
                response = await client.get(path)
                return response.status, await response.json()

            code, body = await get("/stores/per-second/ann")
            assert code == 200 and body["key"] == "ann" and not body["truncated"]
            assert body["windows"] == [{"start": 0, "value": 2}, {"start": 1_000, "value": 1},
                                       {"start": 2_000, "value": 2}]
            code, body = await get("/stores/per-second/ann?from=1000&to=1999")
            assert body["windows"] == [{"start": 1_000, "value": 1}]
            code, body = await get("/stores/per-second/%5B%22ann%22%2C1000%5D?key_format=json")
            assert code == 200 and body["value"] == 1  # one window, by its own key
            code, body = await get("/stores/visits/ann")
            assert body["windows"] == [{"start": 100, "end": 200, "value": 2},
                                       {"start": 1_100, "end": 1_100, "value": 1},
                                       {"start": 2_500, "end": 2_550, "value": 2}]
            code, body = await get("/stores/visits/ann?from=1200&to=2400")
            assert body["windows"] == []  # none ends from 1200 and starts by 2400
            code, body = await get("/stores/visits/bob?to=250")
            assert body["windows"] == []
            code, body = await get("/stores/totals/ann?from=0")
            assert code == 400 and "holds plain keys" in body["error"]
            code, body = await get("/stores/per-second/ann?from=yesterday")
            assert code == 400 and "from must be a time in ms" in body["error"]
