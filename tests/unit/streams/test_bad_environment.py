"""A bad environment or setting is one line naming the setting and a non-zero exit from
``python -m streams run``, never a traceback: a state_dir that is a file or read-only, a
bootstrap address that is malformed, unresolvable or unreachable, an application id or store
name that makes an illegal topic name. No broker is needed: each fails before one is used."""

from __future__ import annotations

import errno
import socket
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from streams.__main__ import main
from streams.app import App
from streams.config import AppConfig, ConfigError
from streams.exit_codes import ExitCode

WORKER = textwrap.dedent("""
    from streams import App
    app = App("env-app")
    app.stream("lines").group_by_key().count(store="counts").to_stream().to("totals")
""")


def run_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               **env: str) -> tuple[int, str]:
    """``python -m streams run worker:app`` in-process with ``RELAY_*`` variables (a
    bootstrap address nothing listens on unless given: the checks before it come first)."""
    env.setdefault("bootstrap_servers", f"127.0.0.1:{closed_port()}")
    (tmp_path / "worker.py").write_text(WORKER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "worker", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(f"RELAY_{name.upper()}", value)
    result = CliRunner().invoke(main, ["run", "worker:app", "--log-level", "ERROR"])
    return result.exit_code, result.output


def assert_one_line(output: str, *fragments: str) -> None:
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    for fragment in fragments:
        assert fragment in lines[0], output


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_state_dir_that_is_a_file_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    for state_dir in ("a-file", "a-file/below"):
        code, output = run_worker(tmp_path, monkeypatch, state_dir=str(tmp_path / state_dir))
        assert code == ExitCode.CONFIG
        assert_one_line(output, "configuration error: state_dir", state_dir)


def test_a_state_dir_that_cannot_be_written_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def read_only(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    from streams.environment import check_state_dir

    monkeypatch.setattr("streams.environment.tempfile.mkstemp", read_only)
    with pytest.raises(ConfigError, match=r"state_dir .* cannot be written: Read-only file system"):
        check_state_dir(tmp_path / "state")


@pytest.mark.parametrize("address", ["host:abc", "host", "host:0", "a b:9092", ":9092",
                                     "127.0.0.1:9092,", "host:70000"])
def test_a_malformed_bootstrap_address_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, address: str,
) -> None:
    code, output = run_worker(tmp_path, monkeypatch, bootstrap_servers=address)
    assert code == ExitCode.CONFIG
    assert_one_line(output, "configuration error: bootstrap_servers")


def test_bootstrap_addresses_parse() -> None:
    from streams.config import parse_bootstrap_servers

    assert parse_bootstrap_servers("a:1, b.example:9092,[::1]:9093") == [
        ("a", 1), ("b.example", 9092), ("::1", 9093)]


@pytest.mark.parametrize("application_id", ["orders/v2", "orders v2", "ordres:1", "über", ".",
                                            "..", "x" * 237])
def test_an_application_id_that_makes_illegal_topic_names_is_refused(application_id: str) -> None:
    with pytest.raises(ConfigError, match="application_id"):
        AppConfig(application_id)


def test_the_longest_legal_application_id_and_a_dead_letter_topic_are_checked() -> None:
    AppConfig("x" * (249 - len("-dead-letters")))
    with pytest.raises(ConfigError, match="dead_letter_topic"):
        AppConfig("a", dead_letter_topic="dead letters")


def test_store_names_that_make_an_internal_topic_too_long_stop_the_run_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = App("a" * 200, state_dir=tmp_path / "state", bootstrap_servers="127.0.0.1:9092")
    app.stream("lines").group_by_key().count(store="s" * 40).to_stream().to("totals")
    with pytest.raises(ConfigError, match=r"application_id .* makes the internal topic"):
        app.run()
    assert not (tmp_path / "state").exists()  # nothing started
    with pytest.raises(ValueError, match="store name 'my counts'"):
        App("b").stream("lines").group_by_key().count(store="my counts")
