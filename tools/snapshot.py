"""``relay snapshot``: build store snapshots with Spark and list what a snapshot folder holds.

``build`` reads a store's changelog (or a Parquet history of keys and values) and writes one
SST file and manifest per task under ``--out``; apps started with ``snapshot_dir`` pointing
there bootstrap stores without a checkpoint from them. Exit codes: the table of every
``relay`` command, :class:`streams.exit_codes.ExitCode`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from statestore.snapshot import (
    MANIFEST_FILE,
    SST_FILE,
    SnapshotError,
    SnapshotManifest,
    read_manifest,
)
from streams.exit_codes import ExitCode

console = Console()


class SnapshotToolError(click.ClickException):
    def __init__(self, message: str, code: int = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.exit_code = int(code)


@click.group()
def snapshot() -> None:
    """Build store snapshots with Spark; list them."""


@snapshot.command()
@click.argument("app")
@click.argument("store")
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--source", type=click.Choice(["changelog", "parquet"]), default="changelog",
              show_default=True, help="The store's changelog, or a Parquet history at PATH.")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Snapshot folder (an app's snapshot_dir).")
@click.option("--bootstrap", envvar="RELAY_BOOTSTRAP_SERVERS", default=None,
              help="Broker address host:port (or RELAY_BOOTSTRAP_SERVERS); for --source "
                   "changelog.")
@click.option("--master", default="local[*]", show_default=True,
              help="Spark master (a session the calling process already runs is used as it "
                   "is).")
@click.option("--subtopology", type=click.IntRange(min=0), default=0, show_default=True,
              help="The sub-topology whose tasks own the store.")
@click.option("--partitions", type=click.IntRange(min=1), default=None,
              help="Parquet: the changelog's partition count, when there is no partition "
                   "column.")
@click.option("--order-column", default="offset", show_default=True,
              help="Parquet: the column that orders a key's rows (the last one wins).")
@click.option("--input-offsets", default=None, metavar="JSON",
              help='Parquet: the input the history reflects, e.g. \'{"clicks": {"0": 1200}}\' '
                   "(topic -> partition -> next offset); tasks resume their input there.")
@click.option("--value-serde", default="msgpack", show_default=True,
              help="The store's value serde (encodes non-binary Parquet values).")
def build(app: str, store: str, path: Path | None, source: str, out_dir: Path,
          bootstrap: str | None, master: str, subtopology: int, partitions: int | None,
          order_column: str, input_offsets: str | None, value_serde: str) -> None:
    """Snapshot STORE of APP from its changelog, or (--source parquet) from PATH.

    Example: relay snapshot build clicks counts --out snapshots --bootstrap host:9092
    """
    if source == "changelog" and path is not None:
        raise click.UsageError("PATH is only for --source parquet")
    if source == "changelog" and bootstrap is None:
        raise SnapshotToolError("--source changelog needs the broker's address: pass --bootstrap "
                                "host:port or set RELAY_BOOTSTRAP_SERVERS", ExitCode.CONFIG)
    if source == "parquet" and path is None:
        raise click.UsageError("--source parquet needs the PATH of the Parquet history")
    if source == "parquet" and path is not None and not path.exists():
        raise click.BadParameter(f"{path} does not exist", param_hint="PATH")
    if input_offsets is not None and source != "parquet":
        raise click.UsageError("--input-offsets is only for --source parquet (a changelog "
                               "snapshot carries the input position it reflects)")
    input_positions = _parse_input_offsets(input_offsets)
    # Spark is an optional extra: imported only when a build runs.
    try:
        from pipeline.errors import (
            BrokerUnreachableError,
            OptionError,
            PipelineError,
            UnknownTopicError,
        )
        from pipeline.kafka import partition_count, run_sync
        from pipeline.snapshot_builder import (
            SnapshotTarget,
            build_from_changelog,
            build_from_dataframe,
        )
        from pipeline.spark import active_spark_session, spark_session
        from statestore.serdes import serde_from_name
    except ImportError as exc:
        raise SnapshotToolError(f"snapshot builds need Spark: pip install "
                                f"'relay-streams[spark]' ({exc})") from exc
    try:
        serde_from_name(value_serde)
        target = SnapshotTarget(app, store, out_dir, subtopology, value_serde=value_serde)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc

    started = time.perf_counter()
    try:
        if source == "changelog":
            assert bootstrap is not None
            # Before Spark starts: a wrong address or name fails in a moment.
            run_sync(partition_count(bootstrap, target.changelog))
        with console.status(f"starting Spark ({master}) …") as status:
            # A session this process already runs (a notebook's, an embedding program's) is
            # used as it is, --master aside, and left running.
            running = active_spark_session()
            spark = running or spark_session(master, f"relay-snapshot-{app}-{store}")
            try:
                status.update(f"building snapshots of {app}/{store} from {source} …")
                if source == "changelog":
                    assert bootstrap is not None
                    manifests = build_from_changelog(spark, bootstrap, target)
                else:
                    history = spark.read.parquet(str(path))
                    manifests = build_from_dataframe(history, target, partitions=partitions,
                                                     order_column=order_column,
                                                     input_offsets=input_positions)
            finally:
                if running is None:
                    spark.stop()
    except BrokerUnreachableError as exc:
        raise SnapshotToolError(str(exc), ExitCode.UNREACHABLE) from exc
    except UnknownTopicError as exc:
        raise SnapshotToolError(f"unknown app or store {app}/{store}: {exc}",
                                ExitCode.USAGE) from exc
    except OptionError as exc:
        raise SnapshotToolError(str(exc), ExitCode.USAGE) from exc
    except PipelineError as exc:
        raise SnapshotToolError(str(exc)) from exc
    except Exception as exc:  # Spark reports errors of its workers as its own exceptions
        raise SnapshotToolError(f"snapshot build failed: {_first_line(exc)}") from exc
    seconds = time.perf_counter() - started
    console.print(manifest_table(f"{app}/{store}: {len(manifests)} snapshots in "
                                 f"{seconds:.1f}s → {out_dir}",
                                 [(target.directory(m.partition), m) for m in manifests]))


@snapshot.command("list")
@click.argument("directory", type=click.Path(path_type=Path, exists=True, file_okay=False))
def list_snapshots(directory: Path) -> None:
    """The snapshots under DIRECTORY (an app's snapshot_dir, or any folder within it)."""
    found: list[tuple[Path, SnapshotManifest]] = []
    broken: list[str] = []
    for manifest_path in sorted(directory.rglob(MANIFEST_FILE)):
        try:
            manifest = read_manifest(manifest_path.parent)
        except SnapshotError as exc:
            broken.append(str(exc))
            continue
        if manifest is not None:
            found.append((manifest_path.parent, manifest))
    if not found and not broken:
        console.print(f"no snapshots under {directory}")
        return
    console.print(manifest_table(f"snapshots under {directory}", found))
    for problem in broken:
        console.print(f"[red]{problem}[/]", highlight=False)
    if broken:
        raise SystemExit(ExitCode.FAILED)


def _parse_input_offsets(text: str | None) -> dict[str, dict[int, int]] | None:
    if text is None:
        return None
    try:
        raw = json.loads(text)
        return {str(topic): {int(p): int(o) for p, o in offsets.items()}
                for topic, offsets in raw.items()}
    except (ValueError, TypeError, AttributeError):
        raise click.BadParameter(
            f'expected JSON like {{"clicks": {{"0": 1200}}}}, not {text!r}',
            param_hint="--input-offsets") from None


def manifest_table(title: str, snapshots: list[tuple[Path, SnapshotManifest]]) -> Table:
    table = Table(title=title)
    for column in ("app", "store", "task", "source", "offset", "records", "size", "sha256"):
        table.add_column(column, justify="right" if column in ("offset", "records", "size")
                         else "left")
    for directory, m in sorted(snapshots, key=lambda s: (s[1].app, s[1].store, s[1].partition)):
        sst = directory / SST_FILE
        size = _size(sst.stat().st_size) if m.records and sst.exists() else "-"
        table.add_row(m.app, m.store, m.task, m.source, f"{m.offset:,}", f"{m.records:,}",
                      size, (m.sha256 or "-")[:12])
    return table


def _size(size: int) -> str:
    return f"{size / 1e6:,.1f} MB" if size >= 1e6 else f"{size / 1e3:,.1f} kB"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    # Spark wraps a worker's error in a traceback: its last line names the cause.
    lines = [line for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error:" in line or "Exception:" in line:
            return line.strip()
    return lines[0] if lines else type(exc).__name__
