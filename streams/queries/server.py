"""Interactive queries over HTTP (aiohttp): ``GET /stores/<store>/<key>`` on any worker, or on
``relay web``, answers for any key of the app.

A worker with ``query_port`` set answers from its own copy when it holds the key's task
(:mod:`streams.queries.store_query`); otherwise it finds the key's owner in the status topic
(:mod:`streams.queries.routing`) and forwards the request there, once: a forwarded request is
answered locally or refused, never forwarded again. ``relay web`` holds no state and always
forwards.

Query string: ``allow_standby=true`` lets a standby or learner copy answer (its lag is in
the answer), ``max_lag=N`` bounds that lag, ``key_format=json`` reads the key as JSON (for
keys that are not strings; the default takes the path segment as a string). Of a windowed or
session store, a record key (not a window's ``[key, start]`` nor a session's ``[key, end,
start]``) or ``from=`` / ``to=`` (ms) asks for the key's windows in that time, oldest first
(``windows``; Kafka Streams' ``WindowStore.fetch`` and ``SessionStore.fetch``).

Answers are JSON: ``200`` with ``value``, ``owner`` (the member whose copy answered),
``role``, ``lag``, ``task`` and ``partition``; ``404`` with ``found: false``, ``reason:
not_found`` and a ``hint`` for a key the store does not hold (it may have been produced with
another partitioner; see docs/partitioning.md), or ``error`` for an unknown store; ``400``
for a key that cannot be read or encoded, or a bad parameter; ``503`` with ``Retry-After``
when no copy may answer right now (restoring, moving, owner unknown or unreachable).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote_to_bytes

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

from streams.environment import UnservableAddressError
from streams.queries.routing import Route, RoutingTable, now_ms
from streams.queries.store_layout import StoreKeyError, StoreLayout
from streams.queries.store_query import (
    GlobalStoreQuery,
    KeyReading,
    LocalStores,
    StoreQuery,
    StoreUnavailable,
    WindowsReading,
)

log = logging.getLogger(__name__)

#: Set on a forwarded request (to the forwarder's endpoint): its receiver does not forward.
FORWARDED_HEADER = "X-Relay-Forwarded-By"
FORWARD_TIMEOUT_S = 5.0
RETRY_AFTER_S = 1
KEY_FORMATS = ("str", "json")


@dataclass(frozen=True)
class QueryRequest:
    """A checked ``GET /stores/<store>/<key>``."""

    store: str
    key: Any
    allow_standby: bool
    max_lag: int | None
    #: ``from`` and ``to``: a windowed or session store's windows of the key in that time.
    time_from: int | None = None
    time_to: int | None = None

    @property
    def in_time(self) -> bool:
        return self.time_from is not None or self.time_to is not None


class BadQuery(ValueError):
    """A request the service cannot answer as asked: a 4xx with ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def path_key(raw_path: str) -> str:
    """The key segment of a ``/stores/<store>/<key>`` path as it was sent, percent-decoded as
    UTF-8. A key whose escapes are not UTF-8 (``%ff``) has no one text: read leniently, it
    would name one key here and another on the worker it is forwarded to."""
    raw_key = raw_path.split("/", 3)[3]
    try:
        return unquote_to_bytes(raw_key).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadQuery(400, f"key {raw_key!r} is not UTF-8 once its %-escapes are decoded "
                            f"(byte {exc.object[exc.start]:#04x}): percent-encode the key's "
                            f"UTF-8 bytes, or send a non-text key with key_format=json"
                       ) from None


def parse_request(store: str, raw_key: str, query: dict[str, str]) -> QueryRequest:
    """The checked request; :class:`BadQuery` (400) naming what is wrong."""
    unknown = sorted(set(query) - {"allow_standby", "max_lag", "key_format", "from", "to"})
    if unknown:
        raise BadQuery(400, f"unknown parameter(s) {', '.join(unknown)}; use allow_standby, "
                            f"max_lag, key_format, from, to")
    key_format = query.get("key_format", "str")
    if key_format not in KEY_FORMATS:
        raise BadQuery(400, f"key_format must be one of {', '.join(KEY_FORMATS)}, "
                            f"not {key_format!r}")
    key: Any = raw_key
    if key_format == "json":
        try:
            key = json.loads(raw_key)
        except ValueError as exc:
            raise BadQuery(400, f"key {raw_key!r} is not valid JSON (key_format=json): "
                                f"{exc}") from None
    return QueryRequest(store, key, _flag(query.get("allow_standby", "false")),
                        _max_lag(query.get("max_lag")), _time(query, "from"),
                        _time(query, "to"))


def _time(query: dict[str, str], name: str) -> int | None:
    return _count(query.get(name), f"{name} must be a time in ms since the epoch (>= 0)")


def _count(raw: str | None, what: str) -> int | None:
    """``raw`` as a whole number >= 0 (None: not given); a 400 saying ``what`` it must be."""
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise BadQuery(400, f"{what}, not {raw!r}")
    return value


def _flag(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise BadQuery(400, f"allow_standby must be true or false, not {raw!r}")


def _max_lag(raw: str | None) -> int | None:
    return _count(raw, "max_lag must be a number of records >= 0")


def not_found_hint(task: str, partition: int, processor: bool = False,
                   windowed: bool = False, sessions: bool = False) -> str:
    """What a 404 for a key says: where it was looked for, and the usual cause of a key
    that was produced yet is not found (its records went to another partition); for a
    ``process()`` step's store, that its code may key it otherwise than its records; for a
    windowed store, that past windows leave it."""
    if sessions:
        return (f"no such session in task {task}, which holds partition {partition}: a "
                f"session is named by its key and both its ends [key, end_ms, start_ms] (a "
                f"key's sessions are listed in process, with app.store(name).range), and "
                f"leaves its store once its inactivity gap and grace have passed")
    if windowed:
        return (f"no such window in task {task}, which holds partition {partition}: a window "
                f"leaves its store once its size and grace have passed (retention_ms= on the "
                f"aggregation keeps windows longer), and a window is named by its start "
                f"[key, window_start_ms]; else the key's records may have gone to another "
                f"partition (relay_misrouted_records_total counts such records)")
    if processor:
        return (f"not in task {task}, which holds partition {partition}: the partition the "
                f"key would be if it were a record's key. This store belongs to a process() "
                f"step, whose code may key it otherwise than its records (an event id in a "
                f"store of records keyed by user): such keys can only be read in the process "
                f"that holds them, with app.store(name).get or .range on each worker")
    return (f"not in task {task}, which holds partition {partition}: the partition that "
            f"murmur2 (Kafka's Java partitioner) gives the key's encoded bytes. If the key was "
            f"produced, its producer may partition otherwise (librdkafka's default does: set "
            f"partitioner=murmur2_random) and its records were counted in another partition; "
            f"relay_misrouted_records_total counts such records")


def unavailable(message: str, reason: str, task: str | None,
                retry_after_s: int = RETRY_AFTER_S) -> web.Response:
    return web.json_response(
        {"error": message, "reason": reason, "task": task, "retry_after_s": retry_after_s},
        status=503, headers={"Retry-After": str(retry_after_s)})


def bad(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


class QueryService:
    """Answers key queries for one app: locally when ``local`` holds the key's task, else by
    forwarding to the owner the routing table names."""

    def __init__(self, table: RoutingTable, local: LocalStores | None = None, *,
                 instance_id: str = "", endpoint: Callable[[], str | None] = lambda: None,
                 clock: Callable[[], int] = now_ms,
                 global_stores: Callable[[], Iterable[str]] = tuple) -> None:
        """``global_stores``: the app's global tables' stores, as a service without local
        stores (``relay web``) knows them from the published topology."""
        self.table = table
        self.local = local
        self._global_stores = global_stores
        self.instance_id = instance_id
        self._endpoint = endpoint
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def layout(self, store: str) -> StoreLayout:
        layouts: dict[str, StoreLayout | str] = {}
        if self.local is not None:
            layouts.update(self.local.layouts())
        if store not in layouts:
            layouts.update(self.table.layouts(self._clock()))
        found = layouts.get(store)
        if found is None:
            globals_ = set(self._global_stores())
            if self.local is not None:
                globals_ |= set(self.local.global_stores())
            if store in globals_:
                raise BadQuery(404, f"{store!r} is a global table, which every instance of the "
                                    f"app holds whole: ask one of them (this service holds "
                                    f"none)")
            known = ", ".join([*sorted(layouts), *(f"{g} (global)" for g in sorted(globals_))])
            raise BadQuery(404, f"unknown store {store!r} (stores: {known or 'none known yet'})")
        if isinstance(found, str):
            raise BadQuery(400, found)
        return found

    async def handle(self, request: web.Request) -> web.Response:
        try:
            query = parse_request(request.match_info["store"],
                                  path_key(request.rel_url.raw_path), dict(request.query))
            table = None if self.local is None else self.local.global_table(query.store)
            if table is not None:
                return self._answer_global(GlobalStoreQuery(table), query)
            layout = self.layout(query.store)
            fetch = windows_asked(layout, query)
            task = layout.task_of(query.key, record_key_given=fetch)
        except BadQuery as exc:
            return bad(exc.status, str(exc))
        except StoreKeyError as exc:
            return bad(400, str(exc))
        partition = int(task.rsplit("_", 1)[1])
        forwarded_by = request.headers.get(FORWARDED_HEADER)
        local_refusal: StoreUnavailable | None = None
        if self.local is not None:
            try:
                if fetch:
                    windows = StoreQuery(query.store, self.local).fetch(
                        query.key, query.time_from, query.time_to,
                        allow_standby=query.allow_standby, max_lag=query.max_lag)
                    return self._answer_windows(windows, partition)
                reading = StoreQuery(query.store, self.local).read(
                    query.key, allow_standby=query.allow_standby, max_lag=query.max_lag)
            except StoreKeyError as exc:
                return bad(400, str(exc))
            except StoreUnavailable as exc:
                local_refusal = exc
            else:
                return self._answer(reading, partition, layout)
            if forwarded_by is not None or local_refusal.reason == "restoring":
                return unavailable(str(local_refusal), local_refusal.reason, task)
        return await self._forward(request, query, task, local_refusal)

    def _answer_global(self, store: GlobalStoreQuery, query: QueryRequest) -> web.Response:
        """A global table's key, answered here: this process holds every key of it."""
        try:
            reading = store.read(query.key)
        except StoreKeyError as exc:
            return bad(400, str(exc))
        except StoreUnavailable as exc:
            return unavailable(str(exc), exc.reason, None)
        body = reading.to_json()
        if not reading.found:
            body["reason"] = "not_found"
            body["hint"] = (f"not in global table {store.name}, which every instance holds "
                            f"whole: no record of its topic has this key")
        body["owner"] = {"member": None, "instance_id": self.instance_id,
                         "endpoint": self._endpoint()}
        return web.json_response(body, status=200 if reading.found else 404, dumps=_dumps)

    def _answer(self, reading: KeyReading, partition: int,
                layout: StoreLayout | None = None) -> web.Response:
        body = reading.to_json()
        body["partition"] = partition
        if not reading.found:
            body["reason"] = "not_found"
            body["hint"] = not_found_hint(
                reading.task, partition, layout is not None and layout.processor,
                layout is not None and layout.windowed, layout is not None and layout.sessions)
        body["owner"] = {"member": reading.thread, "instance_id": self.instance_id,
                         "endpoint": self._endpoint()}
        return web.json_response(body, status=200 if reading.found else 404,
                                 dumps=_dumps)

    def _answer_windows(self, windows: WindowsReading, partition: int) -> web.Response:
        body = windows.to_json()
        body["partition"] = partition
        body["owner"] = {"member": windows.thread, "instance_id": self.instance_id,
                         "endpoint": self._endpoint()}
        return web.json_response(body, dumps=_dumps)

    def _candidates(self, query: QueryRequest, task: str) -> tuple[list[Route], Route | None]:
        """Members to forward to (the active, then allowed copies), and a member restoring
        the task (to say so when nobody can answer)."""
        mine = self._endpoint()
        routes = [r for r in self.table.routes(task, self._clock()) if r.endpoint != mine]
        restoring = next((r for r in routes if r.role == "restoring"), None)
        chosen = [r for r in routes if r.role == "active"]
        if query.allow_standby:
            chosen += [r for r in routes if r.role in ("standby", "learner")
                       and r.lag is not None
                       and (query.max_lag is None or r.lag <= query.max_lag)]
        return chosen, restoring

    def _copy_hint(self, query: QueryRequest, task: str) -> str:
        """Where a copy could answer the query now, if the caller allowed copies."""
        if query.allow_standby:
            return ""
        copies = [r for r in self.table.routes(task, self._clock())
                  if r.role in ("standby", "learner") and r.lag is not None]
        if not copies:
            return ""
        best = min(copies, key=lambda r: (r.lag, r.member))
        return (f", or read the {best.role} copy on {best.member} (lag {best.lag}) with "
                f"allow_standby=true")

    async def _forward(self, request: web.Request, query: QueryRequest, task: str,
                       local_refusal: StoreUnavailable | None) -> web.Response:
        candidates, restoring = self._candidates(query, task)
        if not candidates:
            if restoring is not None:
                return unavailable(f"task {task} of store {query.store} is restoring on "
                                   f"{restoring.member}; retry", "restoring", task)
            if local_refusal is not None and local_refusal.reason != "not_local":
                return unavailable(str(local_refusal), local_refusal.reason, task)
            return unavailable(f"no live member that serves queries holds task {task} of "
                               f"store {query.store} right now (it may be moving, or its "
                               f"owner does not set query_port); retry", "no_owner", task)
        route = candidates[0]
        # The key is sent as this process read it, so that its owner reads the same key.
        path = (f"/stores/{quote(query.store, safe='')}/"
                f"{quote(path_key(request.rel_url.raw_path), safe='')}")
        url = URL(route.endpoint.rstrip("/") + path, encoded=True).with_query(request.query)
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S))
        headers = {FORWARDED_HEADER: self._endpoint() or "relay-web"}
        try:
            async with self._session.get(url, headers=headers) as response:
                text = await response.text()
                status = response.status
                retry_after = response.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            why = (f"within {FORWARD_TIMEOUT_S:g} s" if isinstance(exc, TimeoutError)
                   else f"({str(exc) or type(exc).__name__})")
            return unavailable(f"the owner of task {task} ({route.member} at "
                               f"{route.endpoint}) did not answer {why}; retry"
                               f"{self._copy_hint(query, task)}", "owner_unreachable", task)
        try:
            body = json.loads(text)
        except ValueError:
            return unavailable(f"the owner of task {task} ({route.member}) answered "
                               f"{status} without JSON; retry", "owner_unreachable", task)
        if isinstance(body, dict):
            body["forwarded_by"] = self._endpoint() or "relay-web"
        headers = {"Retry-After": retry_after} if retry_after else {}
        return web.json_response(body, status=status, headers=headers, dumps=_dumps)


def windows_asked(layout: StoreLayout, query: QueryRequest) -> bool:
    """Whether ``query`` asks for a key's windows (or sessions) rather than one entry: a
    time (``from``, ``to``) is given, or the key is a record key, not a window's (or
    session's) own key. A time is refused for a store of plain keys."""
    if not (layout.windowed or layout.sessions):
        if query.in_time:
            raise BadQuery(400, f"from and to read a windowed or session store's windows; "
                                f"store {layout.store} holds plain keys")
        return False
    if query.in_time:
        return True
    try:
        layout.store_key(query.key)
    except StoreKeyError:
        return True
    return False


def _dumps(value: Any) -> str:
    # Values are whatever the store's serde gives back; ones JSON cannot hold are shown as
    # their repr rather than failing the answer.
    return json.dumps(value, default=repr)


@web.middleware
async def json_errors(request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                      ) -> web.StreamResponse:
    """aiohttp's own 404 and 405 answer with a JSON message too."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response({"error": f"{exc.reason}: {request.method} {request.path}; "
                                           f"queries are GET /stores/<store>/<key>"},
                                 status=exc.status)


class RequestErrorLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server log, with a request it cannot parse (a malformed request line or
    header, answered 400) told in one warning line rather than an error with a traceback:
    it is the client's mistake, and the server goes on."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})

    def exception(self, msg: object, *args: object, exc_info: Any = True,
                  **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError) and (exc_info.code or 500) < 500:
            remote = args[0] if args else "?"
            said = " ".join((exc_info.message or type(exc_info).__name__).split())
            self.logger.warning("bad HTTP request from %s: %s", remote, said)
            return
        self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)


def add_query_routes(app: web.Application, service: QueryService) -> None:
    app.router.add_get("/stores/{store}/{key:.+}", service.handle)


def make_query_app(service: QueryService) -> web.Application:
    app = web.Application(middlewares=[json_errors])
    add_query_routes(app, service)
    return app


class QueryServer:
    """A worker's query server, on the app's event loop (the stores are read there)."""

    def __init__(self, service: QueryService) -> None:
        self.service = service
        self.url: str | None = None
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int, advertised_host: str) -> str:
        runner = web.AppRunner(make_query_app(self.service), shutdown_timeout=1.0,
                               access_log=None, logger=RequestErrorLog())
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise UnservableAddressError(
                f"cannot serve queries on {host}:{port} (query_port): {exc.strerror or exc}"
            ) from exc
        self._runner = runner
        bound = runner.addresses[0][1] if runner.addresses else port
        self.url = f"http://{advertised_host}:{bound}"
        return self.url

    async def close(self) -> None:
        await self.service.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
