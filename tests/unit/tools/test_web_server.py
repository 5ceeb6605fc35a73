"""The web view's server without a broker: its routes over real HTTP, fed by an in-memory
model, and the 4xx answers to bad requests."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from streams.app import App
from streams.group.topology_record import decode_topology_record, encode_topology_record
from tests.unit.tools.test_web_model import status
from tools.web import server
from tools.web.follower import GroupFollower
from tools.web.model import GroupModel, TopologyRecord
from tools.web.server import Changes, ServeError, make_app, serve


@pytest.fixture
async def client() -> AsyncIterator[tuple[TestClient, GroupModel, Changes]]:
    model = GroupModel("shop")
    now = int(time.time() * 1000)
    model.apply(status("a", active=("0_0", "0_1"), leader=True, at=now))
    model.apply(status("b", learners={"0_1": 5}, at=now))
    changes = Changes()
    follower = GroupFollower("127.0.0.1:1", model, changes.notify)  # never started
    async with TestClient(TestServer(make_app(model, follower, changes))) as test_client:
        yield test_client, model, changes


async def test_the_page_and_its_assets(client: tuple[TestClient, GroupModel, Changes]) -> None:
    http, _, _ = client
    page = await http.get("/")
    assert page.status == 200 and "/static/app.js" in await page.text()
    script = await http.get("/static/app.js")
    assert script.status == 200 and "EventSource" in await script.text()


async def test_the_json_endpoint(client: tuple[TestClient, GroupModel, Changes]) -> None:
    http, _, _ = client
    response = await http.get("/api/group", params={"window_s": "30"})
    assert response.status == 200
    view = await response.json()
    assert view["app"] == "shop" and view["leader"] == "a-thread-0"
    assert view["window_ms"] == 30_000
    assert view["follower"] == {"error": None, "caught_up": False}
    one = await http.get("/api/tasks/0_1")
    assert one.status == 200
    data = await one.json()
    assert data["active"] == "a-thread-0" and data["beingLearned"] is True
    assert data["learners"][0]["isReady"] is True


async def test_events_push_the_view_when_members_publish(
    client: tuple[TestClient, GroupModel, Changes], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A push follows a burst of changes after a pause; the test's burst is one change.
    monkeypatch.setattr(server, "PUSH_INTERVAL_S", 0.001)
    http, model, changes = client
    response = await http.get("/api/events")
    assert response.headers["Content-Type"] == "text/event-stream"

    async def next_view() -> dict:
        while True:
            line = (await response.content.readline()).decode()
            if line.startswith("data: "):
                return json.loads(line[len("data: "):])

    first = await next_view()
    assert {t["task"] for t in first["tasks"]} == {"0_0", "0_1"}
    model.apply(status("b", active=("0_2",), at=int(time.time() * 1000)))
    changes.notify()
    while True:
        view = await next_view()
        if any(t["task"] == "0_2" for t in view["tasks"]):
            break
    response.close()


@pytest.mark.parametrize(("path", "code", "message"), [
    ("/api/group?window_s=soon", 400, "window_s must be a number of seconds, not 'soon'"),
    ("/api/group?window_s=-5", 400, "window_s must be above 0 and at most 86400, not -5"),
    ("/api/events?window_s=0", 400, "window_s must be above 0 and at most 86400, not 0"),
    ("/api/tasks/orders", 400, "'orders' is not a task id (<sub-topology>_<partition>, e.g. 0_3)"),
    ("/api/tasks/7_7", 404, "unknown task 7_7 of shop (tasks: 0_0, 0_1)"),
    ("/api/nothing", 404, "no such page: /api/nothing"),
])
async def test_bad_requests_get_4xx_with_a_message(
    client: tuple[TestClient, GroupModel, Changes], path: str, code: int, message: str,
) -> None:
    http, _, _ = client
    response = await http.get(path)
    assert response.status == code
    assert await response.json() == {"error": message}


async def test_a_wrong_method_gets_405(client: tuple[TestClient, GroupModel, Changes]) -> None:
    http, _, _ = client
    response = await http.post("/api/group")
    assert response.status == 405
    assert await response.json() == {"error": "POST is not allowed on /api/group"}


async def test_the_topology_once_the_app_published_it(
    client: tuple[TestClient, GroupModel, Changes],
) -> None:
    http, model, _ = client
    missing = await http.get("/api/topology")
    assert missing.status == 404
    assert "shop has published no topology yet" in (await missing.json())["error"]
    app = App("shop", bootstrap_servers="127.0.0.1:1")
    app.stream("orders").group_by_key().count(store="counts").to_stream().to("counts-out")
    published = decode_topology_record(encode_topology_record(app.describe(), "node-a", 5))
    model.apply(TopologyRecord(published, 10))
    response = await http.get("/api/topology")
    assert response.status == 200
    data = await response.json()
    assert (data["app"], data["instance_id"], data["published_ms"]) == ("shop", "node-a", 5)
    assert data["description"] == app.describe().to_data()
    assert data["text"] == str(app.describe())
    drawn = {n["id"]: n for n in data["layout"]["nodes"]}
    assert drawn["node:aggregate-0002"]["kind"] == "processor"
    assert drawn["topic:shop-counts-changelog"]["label"] == "…-counts-changelog"
    assert {"source": "node:source-0001", "target": "node:aggregate-0002"} in [
        {"source": e["source"], "target": e["target"]} for e in data["layout"]["edges"]]
    assert [b["label"] for b in data["layout"]["boxes"]] == ["Sub-topology 0"]
    wrong = await http.delete("/api/topology")
    assert wrong.status == 405
    assert await wrong.json() == {"error": "DELETE is not allowed on /api/topology"}


async def test_a_taken_port_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServeError, match=f"cannot serve on 127.0.0.1:{port}: "):
            await serve("127.0.0.1:1", "shop", "127.0.0.1", port, asyncio.Event(),
                        lambda url: None)


async def test_the_view_forwards_store_queries_to_the_keys_owner() -> None:
    """``/stores/<store>/<key>`` on the view: routed by the status records it follows (the
    forwarding itself is tested with the query service)."""
    from streams.queries.routing import RoutingTable
    from streams.queries.server import QueryService

    model = GroupModel("shop")
    routes = RoutingTable()
    routes.apply("a-thread-0", {"instance_id": "a", "active": ["0_0", "0_1"],
                                "updated_ms": int(time.time() * 1000),
                                "stores": {"counts": {"sub_topology": 0, "partitions": 2,
                                                      "key_serde": "msgpack"}}},
                 int(time.time() * 1000))
    follower = GroupFollower("127.0.0.1:1", model, Changes().notify, routes)
    app = make_app(model, follower, Changes(),
                   QueryService(routes, global_stores=lambda: ["products"]))
    async with TestClient(TestServer(app)) as http:
        unknown = await http.get("/stores/orders/k1")
        assert unknown.status == 404
        assert "unknown store 'orders' (stores: counts, products (global))" in (
            await unknown.json())["error"]
        # A global table is held by every instance, not by the web view: ask one of them.
        held_elsewhere = await http.get("/stores/products/p1")
        assert held_elsewhere.status == 404
        assert "'products' is a global table" in (await held_elsewhere.json())["error"]
        # The owner publishes no query endpoint: retry later, not a stale answer.
        no_endpoint = await http.get("/stores/counts/k1")
        assert no_endpoint.status == 503 and no_endpoint.headers["Retry-After"] == "1"
        assert (await no_endpoint.json())["reason"] == "no_owner"
