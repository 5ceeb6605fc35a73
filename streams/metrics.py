"""Prometheus metrics of a Relay worker: the metric families, the small recorder API the
runtime calls, and their exposition, on a port of their own (``metrics_port``, off by
default) or mounted in a user's own server (aiohttp, ASGI or WSGI).

Each :class:`Metrics` has its own registry, so two apps in one process never mix figures.
Names follow Prometheus conventions: a ``relay_`` prefix, the unit in the name, ``_total``
for counters; labels ``thread`` (the member's static id or thread name) and ``task``.
Recording costs a dictionary lookup and an addition and is meant per batch, not per record;
the recorder is called from the event loop's thread only, while scrapes read from another.
It never raises: a wrong figure (negative count, NaN duration, unknown role or cause) is
logged once per figure and dropped, because metrics must not stop the process loop.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import (
    CONTENT_TYPE_LATEST,
    ThreadingWSGIServer,
    generate_latest,
    make_asgi_app,
    make_wsgi_app,
)

from streams.environment import UnservableAddressError

if TYPE_CHECKING:
    from streams.runtime.task import TaskCounts

log = logging.getLogger(__name__)

#: Roles a task can have on a thread (a restoring active counts as active).
ROLES = ("active", "learner", "standby")
#: Roles of copies, which follow a changelog.
COPY_ROLES = ("learner", "standby")
#: Why the leader moved a task's active to another member.
MOVE_CAUSES = (
    "learner_ready",       # a learner caught up and took over (scale-out, balance)
    "leaving",             # its owner was marked leaving and a learner caught up
    "scale_down_timeout",  # its owner's scale-down deadline passed before a learner was ready
    "lost",                # its owner vanished (after the lost-task hold, if any)
    "balance",             # moved without a learner (stateless tasks, or no copy possible)
)

#: Why a task dropped an input record (see ``relay_dropped_records_total``).
DROP_REASONS = ("late", "deserialize", "no_key", "error")

#: Loop and commit latencies: from a tenth of a millisecond to ten seconds.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Rebalance rounds and restorations: from 10 ms to 10 minutes.
ROUND_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
                 300.0, 600.0)


class Metrics:
    """The metric families of one app and the recorder the runtime calls."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.processed = Counter(
            "relay_records_processed", "Input records processed.", ["thread", "task"],
            registry=r)
        self.dead_letters = Counter(
            "relay_dead_letter_records", "Records sent to the dead-letter topic.",
            ["thread", "task"], registry=r)
        self.dropped = Counter(
            "relay_dropped_records",
            "Input records a task dropped, by reason: late (its window had closed: stream "
            "time past the window's end plus grace), and, also counted as dead letters, "
            "deserialize, no_key (none where an aggregation, table or join needs one) and "
            "error (processing raised).", ["thread", "task", "reason"], registry=r)
        self.misrouted = Counter(
            "relay_misrouted_records",
            "Input records of a stateful task whose key murmur2 places in another partition "
            "than the one they came from (a producer with another partitioner); one record "
            "in 128 is checked.", ["thread", "task"], registry=r)
        self.skipped = Counter(
            "relay_skipped_records",
            "Input records fetched again that the task had already processed (after a seek "
            "back: a rebalance's or a transaction's rollback, a fetch repeated), passed over "
            "so that none is counted twice.", ["thread", "task"], registry=r)
        self.loop = Histogram(
            "relay_process_loop_seconds",
            "Time of one pass of the process loop: fetch, process and ship a batch.",
            ["thread"], buckets=LATENCY_BUCKETS, registry=r)
        self.commit = Histogram(
            "relay_commit_seconds",
            "Time of one commit: flush stores, write checkpoints and commit offsets.",
            ["thread"], buckets=LATENCY_BUCKETS, registry=r)
        self.commits = Counter("relay_commits", "Commits.", ["thread"], registry=r)
        self.input_lag = Gauge(
            "relay_task_input_lag_records",
            "Per active task: end offset of its input minus its committed position.",
            ["thread", "task"], registry=r)
        self.copy_lag = Gauge(
            "relay_copy_changelog_lag_records",
            "Per standby or learner copy: records of the changelog it has not restored yet.",
            ["thread", "task", "role"], registry=r)
        self.copy_rate = Gauge(
            "relay_copy_restore_rate_records_per_second",
            "Per standby or learner copy: changelog records restored per second lately.",
            ["thread", "task", "role"], registry=r)
        self.restorations = Counter(
            "relay_restorations", "Finished restorations (an active's, or a copy catching up).",
            ["thread", "task"], registry=r)
        self.restored_records = Counter(
            "relay_restored_records", "Changelog records restored by finished restorations.",
            ["thread", "task"], registry=r)
        self.restored_bytes = Counter(
            "relay_restored_bytes", "Changelog bytes restored by finished restorations.",
            ["thread", "task"], registry=r)
        self.restoration = Histogram(
            "relay_restoration_seconds", "Time of each finished restoration.",
            ["thread"], buckets=ROUND_BUCKETS, registry=r)
        self.rebalances = Counter("relay_rebalances", "Rebalance rounds.", ["thread"],
                                  registry=r)
        self.rebalance = Histogram(
            "relay_rebalance_seconds",
            "Time of each rebalance round, from joining to the assignment applied.",
            ["thread"], buckets=ROUND_BUCKETS, registry=r)
        self.revoked = Histogram(
            "relay_rebalance_revoked_seconds",
            "Time of each round during which the thread processed nothing: from revoking "
            "what it gives up to resuming what it keeps.",
            ["thread"], buckets=ROUND_BUCKETS, registry=r)
        self.assigned = Gauge(
            "relay_assigned_tasks", "Tasks held by the thread, by role.", ["thread", "role"],
            registry=r)
        self.moved = Counter(
            "relay_tasks_moved", "Tasks whose active moved to another member, by cause "
            "(counted by the leader's thread).", ["thread", "cause"], registry=r)
        self.hold_deadline = Gauge(
            "relay_lost_task_hold_deadline_timestamp_seconds",
            "Per lost task the leader holds back for its owner's return: when it will be "
            "placed elsewhere (Unix time).", ["thread", "task"], registry=r)
        self.scale_down_deadline = Gauge(
            "relay_scale_down_deadline_timestamp_seconds",
            "For a thread of a leaving instance: when it hands its tasks over whether "
            "learners are ready or not (Unix time).", ["thread"], registry=r)
        self._reported: set[str] = set()
        self._held: dict[str, set[str]] = {}       # thread -> tasks with an input lag series
        self._copies: dict[str, set[tuple[str, str]]] = {}  # thread -> (task, role) series
        self._holds: dict[str, set[str]] = {}      # thread -> tasks with a hold deadline

    # -- the recorder -----------------------------------------------------------------------

    def record_processed(self, thread: str, task: str, n: int) -> None:
        if self._count("records processed", n):
            self.processed.labels(thread, task).inc(n)

    def record_dead_letters(self, thread: str, task: str, n: int = 1,
                            reason: str | None = None) -> None:
        """Dead-lettered records; with ``reason``, also counted as dropped for it."""
        if self._count("dead-letter records", n):
            self.dead_letters.labels(thread, task).inc(n)
            if reason is not None:
                self.record_dropped(thread, task, reason, n)

    def record_dropped(self, thread: str, task: str, reason: str, n: int = 1) -> None:
        if self._role("dropped records", reason, DROP_REASONS) \
                and self._count("dropped records", n):
            self.dropped.labels(thread, task, reason).inc(n)

    def record_misrouted(self, thread: str, task: str, n: int) -> None:
        if self._count("misrouted records", n):
            self.misrouted.labels(thread, task).inc(n)

    def record_skipped(self, thread: str, task: str, n: int) -> None:
        if self._count("skipped records", n):
            self.skipped.labels(thread, task).inc(n)

    def record_task_counts(self, thread: str, counts: Iterable[TaskCounts]) -> None:
        """Per task: what it dropped (by reason), saw misrouted and skipped since the last
        call."""
        for counted in counts:
            for reason, n in counted.dropped.items():
                self.record_dropped(thread, counted.task, reason, n)
            if counted.misrouted:
                self.record_misrouted(thread, counted.task, counted.misrouted)
            if counted.skipped:
                self.record_skipped(thread, counted.task, counted.skipped)

    def observe_loop(self, thread: str, seconds: float) -> None:
        if self._seconds("process loop latency", seconds):
            self.loop.labels(thread).observe(seconds)

    def observe_commit(self, thread: str, seconds: float) -> None:
        if self._seconds("commit latency", seconds):
            self.commits.labels(thread).inc()
            self.commit.labels(thread).observe(seconds)

    def set_input_lag(self, thread: str, task: str, records: int) -> None:
        if self._count("input lag", records):
            self._held.setdefault(thread, set()).add(task)
            self.input_lag.labels(thread, task).set(records)

    def set_copy_lag(self, thread: str, task: str, role: str, records: int) -> None:
        if self._role("copy lag", role, COPY_ROLES) and self._count("copy lag", records):
            self._copies.setdefault(thread, set()).add((task, role))
            self.copy_lag.labels(thread, task, role).set(records)

    def set_restore_rate(self, thread: str, task: str, role: str,
                         records_per_second: float) -> None:
        if self._role("restore rate", role, COPY_ROLES) \
                and self._seconds("restore rate", records_per_second):
            self._copies.setdefault(thread, set()).add((task, role))
            self.copy_rate.labels(thread, task, role).set(records_per_second)

    def finished_restoration(self, thread: str, task: str, records: int, seconds: float,
                             size_bytes: int) -> None:
        if self._count("restored records", records) and self._seconds("restoration", seconds) \
                and self._count("restored bytes", size_bytes):
            self.restorations.labels(thread, task).inc()
            self.restored_records.labels(thread, task).inc(records)
            self.restored_bytes.labels(thread, task).inc(size_bytes)
            self.restoration.labels(thread).observe(seconds)

    def rebalance_done(self, thread: str, seconds: float, revoked_seconds: float) -> None:
        if self._seconds("rebalance", seconds) and self._seconds("revoked", revoked_seconds):
            self.rebalances.labels(thread).inc()
            self.rebalance.labels(thread).observe(seconds)
            self.revoked.labels(thread).observe(revoked_seconds)

    def set_assignment(self, thread: str, active: Iterable[str], learners: Iterable[str],
                       standbys: Iterable[str]) -> None:
        """What the thread holds after a rebalance: counts by role, and the per-task series
        of tasks it no longer holds in a role are removed (a scrape shows no stale lag)."""
        held = {"active": set(active), "learner": set(learners), "standby": set(standbys)}
        for role, tasks in held.items():
            self.assigned.labels(thread, role).set(len(tasks))
        for task in self._held.get(thread, set()) - held["active"]:
            self._remove(self.input_lag, thread, task)
        self._held[thread] = self._held.get(thread, set()) & held["active"]
        copies = self._copies.get(thread, set())
        for task, role in copies - {(t, r) for r in COPY_ROLES for t in held[r]}:
            self._remove(self.copy_lag, thread, task, role)
            self._remove(self.copy_rate, thread, task, role)
        self._copies[thread] = {(t, r) for t, r in copies if t in held[r]}

    def record_moved(self, thread: str, cause: str, n: int = 1) -> None:
        if self._role("tasks moved", cause, MOVE_CAUSES) and self._count("tasks moved", n):
            self.moved.labels(thread, cause).inc(n)

    def set_hold_deadlines(self, thread: str, deadlines_ms: Mapping[str, int]) -> None:
        """The leader's hold timers now: lost task -> when it will be placed elsewhere."""
        for task in self._holds.get(thread, set()) - set(deadlines_ms):
            self._remove(self.hold_deadline, thread, task)
        self._holds[thread] = set(deadlines_ms)
        for task, deadline in deadlines_ms.items():
            self.hold_deadline.labels(thread, task).set(deadline / 1000)

    def set_scale_down_deadline(self, thread: str, deadline_ms: int | None) -> None:
        """When a leaving thread hands over regardless; None when it is not leaving."""
        if deadline_ms is None:
            self._remove(self.scale_down_deadline, thread)
        else:
            self.scale_down_deadline.labels(thread).set(deadline_ms / 1000)

    # -- checks -----------------------------------------------------------------------------

    def _count(self, figure: str, n: Any) -> bool:
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            return True
        return self._drop(figure, f"{n!r} is not a count")

    def _seconds(self, figure: str, value: Any) -> bool:
        if isinstance(value, int | float) and not isinstance(value, bool) \
                and math.isfinite(value) and value >= 0:
            return True
        return self._drop(figure, f"{value!r} is not a non-negative number")

    def _role(self, figure: str, value: str, allowed: tuple[str, ...]) -> bool:
        if value in allowed:
            return True
        return self._drop(figure, f"{value!r} is none of {', '.join(allowed)}")

    def _drop(self, figure: str, why: str) -> bool:
        if figure not in self._reported:
            self._reported.add(figure)
            log.warning("metrics: dropped a figure for %s: %s (reported once)", figure, why)
        return False

    @staticmethod
    def _remove(metric: Gauge, *labels: str) -> None:
        with contextlib.suppress(KeyError):
            metric.remove(*labels)

    # -- exposition -------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format (content type :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def aiohttp_handler(self) -> Callable[..., Any]:
        """A handler for an aiohttp app: ``app.router.add_get("/metrics", m.aiohttp_handler())``."""
        from prometheus_client.aiohttp import make_aiohttp_handler

        return make_aiohttp_handler(self.registry)

    def asgi_app(self) -> Callable[..., Any]:
        """An ASGI app to mount, e.g. ``starlette_app.mount("/metrics", m.asgi_app())``."""
        return make_asgi_app(self.registry)

    def wsgi_app(self) -> Callable[..., Any]:
        """A WSGI app to mount in a WSGI server."""
        return make_wsgi_app(self.registry)

    def serve(self, port: int, host: str = "0.0.0.0") -> MetricsServer:
        """Serve ``/metrics`` on ``host:port`` (0: any free port) from a daemon thread, so
        that scrapes never wait on the event loop."""
        family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("MetricsWSGIServer", (ThreadingWSGIServer,),
                            {"address_family": family})
        server = make_server(host, port, metrics_only(make_wsgi_app(self.registry)),
                             server_class, handler_class=QuietHandler)
        thread = threading.Thread(target=server.serve_forever, name="relay-metrics",
                                  daemon=True)
        thread.start()
        return MetricsServer(server, thread, host, server.server_port)


class QuietHandler(WSGIRequestHandler):
    """Scrapes are not logged: one line per scrape would drown the app's log."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def metrics_only(app: Callable[..., Any]) -> Callable[..., Any]:
    """``app`` on ``/metrics``, a 404 saying where the metrics are on any other path: a
    scraper pointed at a wrong path learns of it rather than reading the metrics anyway."""

    def routed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO", "") in ("/metrics", "/metrics/"):
            return app(environ, start_response)
        body = f"no metrics at {environ.get('PATH_INFO', '')}: they are at /metrics\n".encode()
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8"),
                                         ("Content-Length", str(len(body)))])
        return [body]

    return routed


CONTENT_TYPE = CONTENT_TYPE_LATEST


@dataclass
class MetricsServer:
    """A running metrics server; :meth:`close` stops it."""

    server: Any
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def serve_metrics(metrics: Metrics, port: int | None, host: str = "0.0.0.0",
                  ) -> MetricsServer | None:
    """The server for the app's ``metrics_port`` setting; None (nothing served) when unset."""
    if port is None:
        return None
    try:
        return metrics.serve(port, host)
    except OSError as exc:
        raise UnservableAddressError(
            f"cannot serve metrics on {host}:{port} (metrics_port): {exc.strerror or exc}"
        ) from exc
