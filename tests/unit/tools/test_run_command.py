"""``relay run APP`` (and ``python -m streams run``, the same command): what it says and the
exit code it ends with when it cannot run the app, and that no command starts a broker
nobody asked for. No broker is needed: each case fails before one would be used."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from streams.__main__ import main as streams_main
from streams.exit_codes import ExitCode
from tools.cli import cli

WORKER = textwrap.dedent("""
    from streams import App
    app = App("run-app")
    app.stream("lines").group_by_key().count(store="counts").to_stream().to("totals")
    other = App("run-other")
    not_an_app = 42
""")
DOCS = Path(__file__).resolve().parents[3] / "docs" / "cli.md"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory holding ``worker.py``, as the current one; no RELAY_* setting set."""
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "broken.py").write_text("import relay_no_such_dependency\n")
    (tmp_path / "misspelt.py").write_text(
        "from streams import App\n\napp = App('misspelt', num_thread=2)\n")
    (tmp_path / "unparsable.py").write_text("from streams import App\napp = App('x'\n")
    (tmp_path / "buggy.py").write_text("from streams import App\napp = App(42 + 'x')\n")
    (tmp_path / "seconds.py").write_text(
        "from streams import App, TumblingWindows\n\napp = App('seconds')\n"
        "app.stream('in').group_by_key().windowed_by(TumblingWindows(60.0)).count()\n")
    monkeypatch.chdir(tmp_path)
    for module in ("worker", "broken", "misspelt", "unparsable", "buggy", "seconds"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.delenv("RELAY_BOOTSTRAP_SERVERS", raising=False)
    return tmp_path


def relay(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def one_line(result: Result) -> str:
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


def test_without_bootstrap_servers_it_refuses_and_points_to_relay_broker(workdir: Path) -> None:
    result = relay("run", "worker:app", "--log-level", "ERROR")
    assert result.exit_code == ExitCode.CONFIG
    line = one_line(result)
    assert "no bootstrap_servers" in line and "RELAY_BOOTSTRAP_SERVERS" in line
    assert "relay broker" in line
    assert not (workdir / ".relay-state").exists()  # nothing started


def test_python_m_streams_run_is_relay_run() -> None:
    assert streams_main.commands["run"] is cli.commands["run"]


def test_python_m_streams_run_refuses_without_bootstrap_servers_too(workdir: Path) -> None:
    result = CliRunner().invoke(streams_main, ["run", "worker:app"])
    assert result.exit_code == ExitCode.CONFIG
    assert "relay broker" in one_line(result)


@pytest.mark.parametrize("target", ["worker", "worker:", ":app", "worker:app:x"])
def test_an_app_not_named_module_attribute_is_a_usage_error(workdir: Path, target: str) -> None:
    result = relay("run", target)
    assert result.exit_code == ExitCode.USAGE
    assert "expected module:attribute" in result.output


def test_a_module_without_its_attribute_is_shown_the_form_it_needs(workdir: Path) -> None:
    assert "e.g. worker:app" in relay("run", "worker").output


def test_a_missing_module_or_attribute_is_a_usage_error_naming_it(workdir: Path) -> None:
    result = relay("run", "no_such_module:app")
    assert result.exit_code == ExitCode.USAGE
    assert "cannot import 'no_such_module'" in result.output

    result = relay("run", "broken:app")
    assert result.exit_code == ExitCode.USAGE
    assert "it imports 'relay_no_such_dependency', not installed" in result.output

    result = relay("run", "worker:ap")
    assert result.exit_code == ExitCode.USAGE
    assert "no attribute 'ap'; its Apps: app, other" in result.output

    result = relay("run", "worker:not_an_app")
    assert result.exit_code == ExitCode.USAGE
    assert "worker:not_an_app is a int, not a relay App" in result.output


def test_a_bad_setting_is_a_configuration_error(workdir: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_NUM_THREADS", "0")
    result = relay("run", "worker:app")
    assert result.exit_code == ExitCode.CONFIG
    assert one_line(result).startswith("Error: configuration error: num_threads")


def test_a_misspelt_app_argument_is_a_configuration_error_with_a_hint(workdir: Path) -> None:
    result = relay("run", "misspelt:app")
    assert result.exit_code == ExitCode.CONFIG
    line = one_line(result)
    assert line.startswith("Error: configuration error: App() has no setting 'num_thread'")
    assert "misspelt.py, line 3" in line and line.endswith("did you mean num_threads?")


def test_a_window_in_seconds_is_a_configuration_error_of_one_line(workdir: Path) -> None:
    result = relay("run", "seconds:app")
    assert result.exit_code == ExitCode.CONFIG
    line = one_line(result)
    assert line.startswith("Error: topology error: TumblingWindows: size_ms=60.0 is 60 ")
    assert "Traceback" not in result.output


def test_a_module_that_does_not_parse_is_a_usage_error_naming_its_line(workdir: Path) -> None:
    result = relay("run", "unparsable:app")
    assert result.exit_code == ExitCode.USAGE
    assert "cannot import 'unparsable'" in result.output
    assert "unparsable.py, line 2" in result.output and "Traceback" not in result.output


def test_a_bug_of_the_apps_module_keeps_its_traceback(workdir: Path) -> None:
    result = relay("run", "buggy:app")
    assert result.exit_code == ExitCode.FAILED
    assert isinstance(result.exception, TypeError)
    assert "unsupported operand" in str(result.exception)


def test_a_bad_log_level_is_a_usage_error(workdir: Path) -> None:
    result = relay("run", "worker:app", "--log-level", "LOUD")
    assert result.exit_code == ExitCode.USAGE
    assert "--log-level" in result.output


def test_help_lists_the_commands_and_the_exit_codes() -> None:
    result = relay("--help")
    assert result.exit_code == ExitCode.OK
    for command in ("run", "broker", "describe", "web", "mark-leaving", "remove-members",
                    "snapshot"):
        assert re.search(rf"^\s+{command}\s", result.output, re.M), command
    result = relay("run", "--help")
    assert result.exit_code == ExitCode.OK
    assert "module:attribute" in result.output and "--log-level" in result.output
    flat = " ".join(result.output.split())
    assert "Exit codes: 0 done, 1 failed" in flat and "4 configuration error" in flat


@pytest.mark.parametrize("command", [["describe", "some-app"], ["web", "some-app"],
                                     ["mark-leaving", "some-app", "node-1"],
                                     ["remove-members", "some-app", "node-1"]])
def test_commands_that_talk_to_a_broker_need_its_address(
    monkeypatch: pytest.MonkeyPatch, command: list[str],
) -> None:
    monkeypatch.delenv("RELAY_BOOTSTRAP_SERVERS", raising=False)
    result = relay(*command)
    assert result.exit_code == ExitCode.CONFIG
    line = one_line(result)
    assert "no broker address" in line and "--bootstrap" in line and "relay broker" in line


def test_a_snapshot_built_from_a_changelog_needs_the_brokers_address(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.delenv("RELAY_BOOTSTRAP_SERVERS", raising=False)
    result = relay("snapshot", "build", "some-app", "counts", "--out", str(tmp_path))
    assert result.exit_code == ExitCode.CONFIG
    assert "--bootstrap" in one_line(result)


def test_the_docs_list_every_exit_code() -> None:
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*`(\w+)`", DOCS.read_text(), re.M)
    assert [(int(code), name) for code, name in rows] == [(c.value, c.name) for c in ExitCode]


@pytest.mark.parametrize("address", ["host:abc", "127.0.0.1:", "[::1", "127.0.0.1:99999"])
@pytest.mark.parametrize("command", [["describe", "some-app"],
                                     ["mark-leaving", "some-app", "node-1"]])
def test_a_malformed_broker_address_is_one_line_and_a_usage_error(
    command: list[str], address: str,
) -> None:
    result = relay(*command, "--bootstrap", address)
    assert result.exit_code == ExitCode.USAGE
    assert one_line(result).startswith(f"Error: --bootstrap: bootstrap_servers {address!r}")
