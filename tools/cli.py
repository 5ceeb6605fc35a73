"""``relay``: the command-line tool for running and operating Relay apps.

Commands: ``run`` (run an app, :mod:`streams.run_command`), ``broker`` (a broker on a fixed
port, for development: the embedded one, or Apache Kafka with ``--engine kafka``),
``describe`` (the group as Relay sees it), ``web`` (a live web view of the group, see
:mod:`tools.web`), ``mark-leaving`` (announce a scale-down), ``unmark-leaving`` (take it back),
``remove-members`` (remove static members for good), ``reset`` (process the input again
from the start, :mod:`tools.reset`) and ``snapshot build|list`` (store
snapshots built with Spark, see :mod:`tools.snapshot`). Exit codes: one table for every
command, :class:`streams.exit_codes.ExitCode`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaConnectionError, KafkaError
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from assignor import task_sort_key
from streams.config import ConfigError, parse_bootstrap_servers
from streams.exit_codes import ExitCode, summary
from streams.group.control import LeavingMark, control_topic_name, encode_mark, read_marks
from streams.group.described import described_members
from streams.group.member_id import instance_of, thread_id_in
from streams.group.status_topic import read_status as read_member_status
from streams.group.status_topic import status_topic_name
from streams.kafka.membership import MembershipError, describe_group, leave_group
from streams.quirks.detect import broker_quirks
from streams.quirks.switch import Quirk
from streams.run_command import run as run_command
from tools.reset import ResetPlan, ResetRefused, plan_json, published_topology
from tools.reset import reset as reset_app
from tools.snapshot import snapshot

#: What a command that talks to a broker says without an address.
NO_BOOTSTRAP = ("no broker address: pass --bootstrap host:port or set RELAY_BOOTSTRAP_SERVERS "
                "(for development, `relay broker` runs a broker on 127.0.0.1:9092)")
STALE_AFTER_MS = 15_000
#: A member that published its status this lately is taken for running: members publish
#: every second, so a crashed one falls silent within a few.
RUNNING_WITHIN_MS = 5_000
console = Console()
T = TypeVar("T")


class ToolError(click.ClickException):
    def __init__(self, message: str, code: int = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.exit_code = int(code)


def run(bootstrap: str | None, work: Callable[[str], Awaitable[T]]) -> T:
    """Run ``work(bootstrap)``. Without a bootstrap address it is a configuration error: no
    broker is started behind the user's back (a fresh one would know no apps anyway)."""
    if not bootstrap:
        raise ToolError(NO_BOOTSTRAP, ExitCode.CONFIG)
    try:
        parse_bootstrap_servers(bootstrap)
    except ConfigError as exc:
        raise ToolError(f"--bootstrap: {exc}", ExitCode.USAGE) from None
    # The client's own log of a failed connection would otherwise reach stderr beside the
    # one line that says what failed (its records would find no handler but Python's last
    # resort): the error below carries its cause.
    client_log = logging.getLogger("aiokafka")
    if not any(isinstance(h, logging.NullHandler) for h in client_log.handlers):
        client_log.addHandler(logging.NullHandler())
    try:
        return asyncio.run(work(bootstrap))
    except KafkaConnectionError as exc:
        raise ToolError(f"cannot reach the broker at {bootstrap}: {exc}",
                        ExitCode.UNREACHABLE) from exc
    except (KafkaError, OSError) as exc:
        if "Unable to bootstrap" in str(exc) or isinstance(exc, OSError):
            raise ToolError(f"cannot reach the broker at {bootstrap}: {exc}",
                            ExitCode.UNREACHABLE) from exc
        raise ToolError(f"broker error: {exc}") from exc


async def _admin(bootstrap: str) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        await asyncio.wait_for(admin.start(), 15)
    except (TimeoutError, KafkaError, OSError) as exc:
        raise ToolError(f"cannot reach the broker at {bootstrap}: {exc}",
                        ExitCode.UNREACHABLE) from exc
    return admin


async def read_status(bootstrap: str, app: str) -> dict[str, dict[str, Any]]:
    """The latest status record of every member of ``app`` (tombstones removed)."""
    admin = await _admin(bootstrap)
    try:
        topics = set(await admin.list_topics())
    finally:
        await admin.close()
    topic = status_topic_name(app)
    if topic not in topics:
        hint = ("; APP here is the application id, the first argument of App(...), not the "
                "module:attribute of relay run" if ":" in app else "")
        raise ToolError(f"unknown app {app!r}: there is no topic {topic} on {bootstrap}{hint}",
                        ExitCode.USAGE)
    return await read_member_status(bootstrap, app)


def live(status: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    now = time.time() * 1000
    return {k: v for k, v in status.items() if now - v.get("updated_ms", 0) < STALE_AFTER_MS}


def leaderless(members: dict[str, dict[str, Any]]) -> str | None:
    """What to say of a group whose members all say they did not lead its last round: a
    static member that restarts within its session gets its assignment back with no round,
    so if it led the group, nobody has led one since."""
    if not members or any(s.get("leader") for s in members.values()):
        return None
    return ("no member has led a round since the group's leader restarted (a static restart "
            "starts none); the next round names one")


async def published_tasks(client: AIOKafkaClient, address: str, app: str) -> list[str]:
    """The app's tasks from the topology it published last on its control topic: per
    sub-topology, one per partition of its source topics (none if it published none, or
    its topics are gone)."""
    try:
        description = await published_topology(address, app)
    except ResetRefused:
        return []
    sources = {sub.id: {t for node in sub.nodes if node.kind == "Source" for t in node.topics}
               for sub in description.sub_topologies}
    cluster = await client.fetch_all_metadata()
    tasks = []
    for sub_id, topics in sorted(sources.items()):
        counts = [len(cluster.partitions_for_topic(t) or ()) for t in sorted(topics)]
        tasks += [f"{sub_id}_{p}" for p in range(max(counts, default=0))]
    return tasks


def task_view(members: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task: its active (or restoring) member, its learners and standbys. Every task of
    the app is listed, those that no member runs too (members publish the app's tasks)."""
    tasks: dict[str, dict[str, Any]] = {}

    def entry(task: str) -> dict[str, Any]:
        return tasks.setdefault(task, {"active": None, "restoring": None, "learners": [],
                                       "standbys": []})

    for s in members.values():
        for task in s.get("app_tasks", ()):
            entry(task)
    for member, s in members.items():
        for task in s["active"]:
            entry(task)["active"] = member
        for task in s["restoring"]:
            entry(task)["restoring"] = member
        accept = s.get("acceptable_lag", 0)
        for kind in ("learners", "standbys"):
            for task, lag in s[kind].items():
                entry(task)[kind].append(
                    {"member": member, "lag": lag, "isReady": lag <= accept}
                )
    return dict(sorted(tasks.items(), key=lambda kv: task_sort_key(kv[0])))


def unowned_tasks(tasks: dict[str, dict[str, Any]]) -> list[str]:
    """Tasks that no member runs or restores."""
    return [t for t, view in tasks.items() if view["active"] is None and view["restoring"] is None]


@click.group(epilog=f"Exit codes: {summary()}.")
def cli() -> None:
    """Run and operate Relay apps: run one, describe its group, scale down, remove members,
    build snapshots; and a broker for development."""


cli.add_command(run_command, "run")
cli.add_command(snapshot)


bootstrap_option = click.option(
    "--bootstrap", envvar="RELAY_BOOTSTRAP_SERVERS", default=None,
    help="Broker address host:port (or RELAY_BOOTSTRAP_SERVERS).",
)


def heard(age_ms: float) -> str:
    """How long ago a member last published its status; silent for a few seconds, it may be
    dead (members publish every second), which the table says before the group does."""
    text = f"{max(age_ms, 0) / 1000:.0f} s ago"
    return text if age_ms < RUNNING_WITHIN_MS else f"[yellow]{text} (silent)[/]"


def print_whole(table: Table) -> None:
    """Prints ``table`` at its natural width, wider than the terminal if need be: member and
    instance names cut to fit 80 columns would tell no member apart."""
    natural = Measurement.get(console, console.options.update(width=10_000), table).maximum
    width = console.width
    console.width = max(width, natural)
    try:
        console.print(table)
    finally:
        console.width = width


@cli.command()
@click.argument("app")
@bootstrap_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--all", "show_all", is_flag=True, help="Include members not heard of lately.")
def describe(app: str, bootstrap: str | None, as_json: bool, show_all: bool) -> None:
    """The group of APP as Relay sees it: members and, per task, its owners and copies."""

    async def work(address: str) -> dict[str, Any]:
        status = await read_status(address, app)
        members = status if show_all else live(status)
        client = AIOKafkaClient(bootstrap_servers=address)
        await client.bootstrap()
        try:
            group = await describe_group(client, app)
            tasks = task_view(members)
            if not tasks:
                # No member publishes the app's tasks (none runs): the published topology and
                # its source topics' partitions name them, every one unowned.
                tasks = {task: {"active": None, "restoring": None, "learners": [],
                                "standbys": []}
                         for task in await published_tasks(client, address, app)}
        finally:
            await client.close()
        described = described_members(group.members)
        return {"app": app, "state": group.state, "protocol": group.protocol,
                "members": members, "tasks": tasks, "unowned": unowned_tasks(tasks),
                # None when the broker keeps no member metadata (Tansu); [] for no member.
                "broker_members": None if described is None else
                [m.to_json() for m in sorted(described, key=lambda m: m.static_id or "")]}

    result = run(bootstrap, work)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    state = result["state"] if result["state"] not in ("", "Unknown") else \
        "state not reported by the broker"
    protocol = f" ({result['protocol']})" if result["protocol"] else ""
    table = Table(title=f"{app}: group {state}{protocol}")
    columns = ("member", "instance", "thread", "pid", "generation", "leader", "active", "leaving",
               "heard")
    for column in columns:
        table.add_column(column)
    now_ms = time.time() * 1000
    for member, s in sorted(result["members"].items()):
        table.add_row(member, s["instance_id"], str(s["thread"]), str(s["pid"]),
                      str(s["generation"]), "yes" if s.get("leader") else "",
                      ", ".join(s["active"]) or "-", "yes" if s["leaving"] else "",
                      heard(now_ms - s.get("updated_ms", 0)))
    print_whole(table)
    note = leaderless(result["members"])
    if note:
        console.print(note, highlight=False)
    tasks = Table(title="tasks")
    for column in ("task", "active", "learners (lag, ready)", "standbys (lag, ready)"):
        tasks.add_column(column)
    for task, view in result["tasks"].items():
        active = view["active"] or (f"restoring on {view['restoring']}" if view["restoring"]
                                    else "[red]nobody[/]")

        def copies(kind: str, view: dict[str, Any] = view) -> str:
            return ", ".join(f"{c['member']} ({c['lag']}, {'ready' if c['isReady'] else 'no'})"
                             for c in view[kind]) or "-"

        tasks.add_row(task, active, copies("learners"), copies("standbys"))
    print_whole(tasks)
    if result["unowned"]:
        console.print(f"[red]not run by any member: {', '.join(result['unowned'])}[/]",
                      highlight=False)
    if result["broker_members"] is None:
        console.print("this broker keeps no member metadata (the embedded one does not): "
                      "the tables show what the members report on the status topic",
                      highlight=False)
        return
    if not result["broker_members"]:
        console.print("the broker counts no member in the group", highlight=False)
        return
    broker_table = Table(title="the last round, as the broker holds it")
    for column in ("member", "member id", "assigned active", "learners", "standbys"):
        broker_table.add_column(column)
    for m in result["broker_members"]:
        broker_table.add_row(
            m["static_id"] or "-", m["member_id"],
            "-" if m["active"] is None else ", ".join(m["active"]) or "-",
            ", ".join(m["learners"]) or "-", ", ".join(m["standbys"]) or "-")
        if m["problem"]:
            console.print(f"[red]{m['member_id']}: {m['problem']}[/]", highlight=False)
    print_whole(broker_table)


@cli.command()
@click.argument("app")
@bootstrap_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port to serve on (0: any free port).")
@click.option("--window-minutes", type=click.FloatRange(min=0, min_open=True), default=10,
              show_default=True, help="How far back the timeline reaches.")
def web(app: str, bootstrap: str | None, host: str, port: int, window_minutes: float) -> None:
    """Serve a live web view of APP: members, tasks and their copies, leaving instances and
    a timeline of rebalances and moves (JSON at /api/group)."""
    import signal

    from tools.web.server import ServeError, serve

    async def work(address: str) -> None:
        await read_status(address, app)  # an unknown app is an error before serving
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def ready(url: str) -> None:
            click.echo(f"Relay web view of {app} at {url} (JSON at {url}api/group)")
            sys.stdout.flush()

        try:
            await serve(address, app, host, port, stop, ready, int(window_minutes * 60_000))
        except ServeError as exc:
            raise ToolError(str(exc)) from None

    run(bootstrap, work)


def cannot_listen(host: str, port: int) -> OSError | None:
    """Why a broker could not listen on ``host:port`` (None: it can). Bound as a listener
    binds: connections of a broker just stopped, still closing on the port (TIME_WAIT), do
    not keep another from listening there."""
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc
    return None


@cli.command()
@click.option("--port", type=click.IntRange(1, 65535), default=9092, show_default=True,
              help="Port to listen on.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--engine", type=click.Choice(["tansu", "kafka"]), default="tansu",
              show_default=True,
              help="tansu: the embedded broker; kafka: Apache Kafka in KRaft mode (needs Java "
                   "17+, and Maven on first use to fetch its jars).")
def broker(port: int, host: str, engine: str) -> None:
    """Run a broker in the foreground until Ctrl-C, so that several processes of an app can
    share it during development (it forgets everything on exit)."""
    import signal

    from streams.testing.engines import broker_for
    from streams.testing.loopback import BrokerError

    refused = cannot_listen(host, port)
    if refused is not None:
        raise ToolError(f"cannot listen on {host}:{port}: {refused.strerror or refused} "
                        "(another broker running? pick another --port)")
    stop = False

    def on_signal(_signum: int, _frame: Any) -> None:
        nonlocal stop
        stop = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with broker_for(engine, port=port, host=host) as running:
            click.echo(f"{running.name} at {running.bootstrap_servers} (Ctrl-C to stop); "
                       f"RELAY_BOOTSTRAP_SERVERS={running.bootstrap_servers}")
            sys.stdout.flush()
            while not stop:
                if not running.running:
                    raise ToolError(f"the {running.name} exited")
                time.sleep(0.2)
            name = running.name
    except BrokerError as exc:
        raise ToolError(str(exc)) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    click.echo(f"{name} stopped")


@cli.command("mark-leaving")
@click.argument("app")
@click.argument("instances", nargs=-1, required=True)
@bootstrap_option
@click.option("--timeout-ms", type=click.IntRange(min=0), default=None,
              help="Scale-down timeout for these instances (default: the app's setting).")
def mark_leaving(app: str, instances: tuple[str, ...], bootstrap: str | None,
                 timeout_ms: int | None) -> None:
    """Tell INSTANCES (group instance ids) of APP that they will leave.

    They rejoin with the leaving flag, hand their tasks to learners on the other instances,
    and shut down when they have nothing left (or when the scale-down timeout has passed).
    """

    async def work(address: str) -> list[str]:
        status = live(await read_status(address, app))
        known = {s["instance_id"] for s in status.values()}
        unknown = sorted(set(instances) - known)
        if unknown:
            raise ToolError(
                f"unknown instance(s) of {app}: {', '.join(unknown)}; running instances: "
                f"{', '.join(sorted(known)) or 'none'} (as `relay describe` names them)",
                ExitCode.USAGE,
            )
        refuse_leaving_none(app, instances, status)
        producer = AIOKafkaProducer(bootstrap_servers=address)
        await producer.start()
        try:
            mark = LeavingMark(int(time.time() * 1000), timeout_ms)
            for instance in instances:
                await producer.send_and_wait(control_topic_name(app), key=instance.encode(),
                                             value=encode_mark(mark))
        finally:
            await producer.stop()
        return list(instances)

    marked = run(bootstrap, work)
    console.print(f"marked as leaving: {', '.join(marked)}")


@cli.command("unmark-leaving")
@click.argument("app")
@click.argument("instances", nargs=-1, required=True)
@bootstrap_option
def unmark_leaving(app: str, instances: tuple[str, ...], bootstrap: str | None) -> None:
    """Take back the leaving marks of INSTANCES (group instance ids) of APP.

    A running instance that was handing over stays: it rejoins as a normal member, keeps
    what it still runs, and balance may give it tasks back. One already told to shut down
    goes all the same. An instance that was not marked is left as it is.
    """

    async def work(address: str) -> tuple[list[str], list[str]]:
        marks = await read_marks(address, app)
        if marks is None:
            raise ToolError(f"unknown app {app!r}: it has no control topic "
                            f"({control_topic_name(app)})", ExitCode.USAGE)
        unmarked = [i for i in instances if i in marks]
        producer = AIOKafkaProducer(bootstrap_servers=address)
        await producer.start()
        try:
            for instance in unmarked:
                await producer.send_and_wait(control_topic_name(app), key=instance.encode(),
                                             value=None)
        finally:
            await producer.stop()
        return unmarked, [i for i in instances if i not in marks]

    unmarked, not_marked = run(bootstrap, work)
    if unmarked:
        console.print(f"no longer leaving: {', '.join(unmarked)}", highlight=False)
    if not_marked:
        console.print(f"not marked, left as they are: {', '.join(not_marked)}",
                      highlight=False)


@cli.command("remove-members")
@click.argument("app")
@click.argument("instances", nargs=-1, required=True)
@bootstrap_option
@click.option("--force", is_flag=True,
              help="Remove instances that still publish their status (they rejoin at once).")
def remove_members(app: str, instances: tuple[str, ...], bootstrap: str | None,
                   force: bool) -> None:
    """Remove static members of APP now (KIP-345), for instances gone for good.

    INSTANCES are group instance ids; every thread of each (``<id>-thread-<n>``) is removed.
    An instance still running is refused without --force: removed, it would rejoin at once
    and its tasks would move twice (stop it, or scale it down with mark-leaving).
    """

    async def work(address: str) -> dict[str, str | None]:
        status = await read_status(address, app)  # an unknown app is said as elsewhere
        client = AIOKafkaClient(bootstrap_servers=address)
        await client.bootstrap()
        try:
            group = await describe_group(client, app)
            if not group.members and group.state in ("Dead", ""):
                raise ToolError(f"unknown app {app!r}: the group has no members",
                                ExitCode.USAGE)
            pairs: list[tuple[str, str]] = []
            for instance in instances:
                found = static_members(group.members, app, instance)
                if not found:
                    raise ToolError(
                        f"instance {instance!r} is not a member of {app} (members: "
                        f"{', '.join(sorted(m.member_id for m in group.members)) or 'none'})",
                        ExitCode.USAGE,
                    )
                pairs.extend(found)
            if not force:
                refuse_running(app, instances, status)
            if Quirk.LEAVE_NEEDS_MEMBER_ID not in await broker_quirks("auto", None, address,
                                                                      embedded=False):
                # KIP-345: the instance id alone removes whichever member holds it now.
                pairs = [("", static) for _member, static in pairs]
            answers = await leave_group(client, app, pairs)
            after = await describe_group(client, app)
            remaining = {static for _m, static in static_members(after.members, app, "")}
            return removal_outcome(answers, remaining)
        finally:
            await client.close()

    try:
        results = run(bootstrap, work)
    except MembershipError as exc:
        raise ToolError(str(exc)) from exc
    for static_id, (_removed, message) in sorted(results.items()):
        console.print(f"{static_id}: {message}", highlight=False)
    if not all(removed for removed, _message in results.values()):
        sys.exit(ExitCode.FAILED)


@cli.command()
@click.argument("app")
@bootstrap_option
@click.option("--state-dir", "state_dirs", multiple=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Also delete the app's local state under this state directory "
                   "(repeatable; one per process on this machine).")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of lines.")
def reset(app: str, bootstrap: str | None, state_dirs: tuple[Path, ...], dry_run: bool,
          as_json: bool) -> None:
    """Make APP process its input again from the start (every instance stopped).

    Deletes APP's consumer group (its committed offsets: every source is read again from
    its earliest offset) and its internal topics (repartition topics, changelogs), as the
    topology APP last published names them. Sources, sinks and other apps' topics are kept.
    Local state left on other machines is discarded by their next run.
    """

    async def work(address: str) -> ResetPlan:
        status = await read_status(address, app)
        return await reset_app(address, app, live(status), state_dirs, dry_run)

    try:
        plan = run(bootstrap, work)
    except ResetRefused as exc:
        raise ToolError(f"reset refused, nothing changed: {exc}", ExitCode.USAGE) from None
    if as_json:
        click.echo(json.dumps(plan_json(plan, dry_run), indent=2))
        return
    for line in plan.lines():
        click.echo(f"would delete: {line.replace(': deleted', '')}" if dry_run else line)
    if not dry_run:
        click.echo(f"{app} reset: its next run processes its input from the start")


def refuse_leaving_none(app: str, instances: tuple[str, ...],
                        status: dict[str, dict[str, Any]]) -> None:
    """A :class:`ToolError` when marking ``instances`` leaves no running instance to hand the
    tasks to: with none staying, the learners have nowhere to go, and the marked instances
    would keep their tasks past any timeout, marked until another instance joins. An
    instance silent for :data:`RUNNING_WITHIN_MS` (crashed, most likely) does not stay."""
    now = time.time() * 1000
    running = {s["instance_id"] for s in status.values()
               if now - s.get("updated_ms", 0) < RUNNING_WITHIN_MS}
    silent = {s["instance_id"] for s in status.values()} - running
    leaving = {s["instance_id"] for s in status.values() if s.get("leaving")}
    if running - leaving - set(instances):
        return
    raise ToolError(
        f"marking {', '.join(instances)} would leave no instance of {app} to hand the tasks "
        f"to (running: {', '.join(sorted(running)) or 'none'}; already leaving: "
        f"{', '.join(sorted(leaving)) or 'none'}"
        + (f"; silent for {RUNNING_WITHIN_MS // 1000} s or more: {', '.join(sorted(silent))}"
           if silent else "") + "); start another instance first", ExitCode.USAGE)


def refuse_running(app: str, instances: tuple[str, ...],
                   status: dict[str, dict[str, Any]]) -> None:
    """A :class:`ToolError` for instances among ``instances`` whose threads published their
    status within :data:`RUNNING_WITHIN_MS`: they look alive (members publish every second),
    and a crashed one is silent after a few seconds."""
    now = time.time() * 1000
    ages = {}
    for record in status.values():
        instance = record.get("instance_id")
        age = now - record.get("updated_ms", 0)
        if instance in instances and age < RUNNING_WITHIN_MS:
            ages[instance] = min(age / 1000, ages.get(instance, age / 1000))
    if ages:
        running = ", ".join(f"{i} (published its status {max(a, 0):.0f} s ago)"
                            for i, a in sorted(ages.items()))
        raise ToolError(
            f"{running} of {app} looks alive: removed, it would rejoin at once and its tasks "
            f"would move twice. Stop its process first, or scale it down with `relay "
            f"mark-leaving {app} {' '.join(sorted(ages))}`; if its process is gone, retry in "
            f"a few seconds, or pass --force", ExitCode.USAGE)


def removal_outcome(answers: dict[str, str | None],
                    remaining: set[str]) -> dict[str, tuple[bool, str]]:
    """Per static id: whether it is out of the group, and what happened. What counts is the
    group after the removal: a broker can answer a removal with an error (Tansu answers
    UnknownMemberIdError for a member whose session it had expired but still kept) and
    remove the member all the same."""
    outcome: dict[str, tuple[bool, str]] = {}
    for static_id, error in answers.items():
        if static_id in remaining:
            outcome[static_id] = (False, f"still a member of the group (the broker answered "
                                         f"{error or 'no error'})")
        elif error is None:
            outcome[static_id] = (True, "removed")
        else:
            outcome[static_id] = (True, f"removed (no longer a member of the group; the "
                                        f"broker answered {error})")
    return outcome


def static_members(members: Any, app: str, instance: str) -> list[tuple[str, str]]:
    """``(member_id, group_instance_id)`` of every thread of ``instance`` (of every instance
    when it is empty).

    The broker tells a member's instance id (DescribeGroups v4); failing that, brokers name a
    static member ``<group_instance_id>-<uuid>`` and Relay's client ids are
    ``<app>-<group_instance_id>``. Each identifies the threads ``<instance>-thread-<n>``.
    """
    found = []
    for member in members:
        static_id = (thread_id_in(member.group_instance_id or "")
                     or thread_id_in(member.member_id) or thread_id_in(member.client_id, app))
        if static_id is not None and (not instance or instance_of(static_id) == instance):
            found.append((member.member_id, static_id))
    return found


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
