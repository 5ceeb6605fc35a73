"""The web view's server (aiohttp): the page, its JSON and a stream of updates.

Routes: ``/`` the page; ``/static/...`` its script and style; ``/api/group`` the view's data
(``?window_s=`` sets the timeline's reach); ``/api/tasks/<task>`` one task;
``/api/events`` the same data as server-sent events, pushed when members publish and once a
second for the clocks; ``/api/topology`` the topology the app published, with its layout
(:mod:`tools.web.topology_layout`) for the page to draw; ``/stores/<store>/<key>`` an
interactive query, forwarded to the key's owner (:mod:`streams.queries.server`). Bad requests
get a 4xx with ``{"error": message}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from streams.queries.routing import RoutingTable
from streams.queries.server import QueryService, RequestErrorLog, add_query_routes
from tools.web.follower import GroupFollower
from tools.web.model import DEFAULT_WINDOW_MS, GroupModel
from tools.web.topology_layout import layout_topology

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
MAX_WINDOW_S = 24 * 3600
#: Pushes to the page are at most this often, however many members publish.
PUSH_INTERVAL_S = 0.25
TICK_S = 1.0
_TASK_ID = re.compile(r"^\d+_\d+$")

MODEL_KEY = web.AppKey("model", GroupModel)
CHANGED_KEY = web.AppKey("changed", "Changes")
FOLLOWER_KEY = web.AppKey("follower", GroupFollower)


class ServeError(Exception):
    """The view cannot be served (e.g. its port is taken)."""


class Changes:
    """Wakes every waiting stream when the model changed; keeps the last rendered push so
    that many open pages cost one rendering per change and second."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.version = 0
        self.rendered: tuple[tuple[int, int | None, int], bytes] | None = None

    def notify(self) -> None:
        self.version += 1
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout_s)


def _error(status: type[web.HTTPError], message: str) -> web.HTTPError:
    return status(text=json.dumps({"error": message}), content_type="application/json")


@web.middleware
async def json_errors(request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                      ) -> web.StreamResponse:
    """Every 4xx answers with a JSON message, including aiohttp's own 404 and 405."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        messages = {404: f"no such page: {request.path}",
                    405: f"{request.method} is not allowed on {request.path}"}
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow",)}
        return web.json_response({"error": messages.get(exc.status, exc.reason)},
                                 status=exc.status, headers=headers)


def window_ms(request: web.Request) -> int | None:
    raw = request.query.get("window_s")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        raise _error(web.HTTPBadRequest, f"window_s must be a number of seconds, not {raw!r}") \
            from None
    if not 0 < seconds <= MAX_WINDOW_S:
        raise _error(web.HTTPBadRequest,
                     f"window_s must be above 0 and at most {MAX_WINDOW_S}, not {raw}")
    return int(seconds * 1000)


def _snapshot(request: web.Request, window: int | None) -> dict[str, Any]:
    follower = request.app[FOLLOWER_KEY]
    view = request.app[MODEL_KEY].view(int(time.time() * 1000), window)
    view["follower"] = {"error": follower.error, "caught_up": follower.caught_up}
    return view


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


async def group(request: web.Request) -> web.Response:
    return web.json_response(_snapshot(request, window_ms(request)))


async def one_task(request: web.Request) -> web.Response:
    task = request.match_info["task"]
    if not _TASK_ID.match(task):
        raise _error(web.HTTPBadRequest,
                     f"{task!r} is not a task id (<sub-topology>_<partition>, e.g. 0_3)")
    view = _snapshot(request, None)
    for item in view["tasks"]:
        if item["task"] == task:
            return web.json_response(item)
    known = ", ".join(t["task"] for t in view["tasks"]) or "none yet"
    raise _error(web.HTTPNotFound, f"unknown task {task} of {view['app']} (tasks: {known})")


async def topology(request: web.Request) -> web.Response:
    model = request.app[MODEL_KEY]
    published = model.topology
    if published is None:
        raise _error(web.HTTPNotFound,
                     f"{model.app} has published no topology yet (an app publishes it when "
                     f"it starts; one older than this view does not)")
    description = published.description
    return web.json_response({
        "app": model.app, "instance_id": published.instance_id,
        "published_ms": published.published_ms, "description": description.to_data(),
        "text": str(description),
        "layout": layout_topology(description, model.app).to_data(),
    })


async def events(request: web.Request) -> web.StreamResponse:
    window = window_ms(request)
    changes = request.app[CHANGED_KEY]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    try:
        while True:
            key = (changes.version, window, int(time.time()))
            if changes.rendered is None or changes.rendered[0] != key:
                data = json.dumps(_snapshot(request, window), separators=(",", ":"))
                changes.rendered = (key, f"data: {data}\n\n".encode())
            await response.write(changes.rendered[1])
            version = changes.version
            await changes.wait(TICK_S)
            if changes.version != version:
                await asyncio.sleep(PUSH_INTERVAL_S)  # let a burst of records settle
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    return response


def make_app(model: GroupModel, follower: GroupFollower, changes: Changes,
             queries: QueryService | None = None) -> web.Application:
    app = web.Application(middlewares=[json_errors])
    if queries is not None:
        add_query_routes(app, queries)
    app[MODEL_KEY] = model
    app[CHANGED_KEY] = changes
    app[FOLLOWER_KEY] = follower
    app.router.add_get("/", index)
    app.router.add_get("/api/group", group)
    app.router.add_get("/api/tasks/{task}", one_task)
    app.router.add_get("/api/events", events)
    app.router.add_get("/api/topology", topology)
    app.router.add_static("/static/", STATIC)
    return app


async def serve(bootstrap: str, app_id: str, host: str, port: int, stop: asyncio.Event,
                on_ready: Callable[[str], None], window: int = DEFAULT_WINDOW_MS) -> None:
    """Follow ``app_id``'s topics and serve the view on ``host:port`` until ``stop`` is set;
    ``on_ready`` gets the page's address (port 0 picks a free one)."""
    model = GroupModel(app_id, window)
    changes = Changes()
    routes = RoutingTable()
    follower = GroupFollower(bootstrap, model, changes.notify, routes)
    queries = QueryService(routes, global_stores=lambda: (
        model.topology.description.global_stores if model.topology is not None else ()))
    runner = web.AppRunner(make_app(model, follower, changes, queries), shutdown_timeout=1.0,
                           logger=RequestErrorLog())
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await queries.close()
        await runner.cleanup()
        raise ServeError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    bound = runner.addresses[0][1] if runner.addresses else port
    following = asyncio.create_task(follower.run(stop))
    try:
        on_ready(f"http://{host}:{bound}/")
        await stop.wait()
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await following
        await queries.close()
        await runner.cleanup()
