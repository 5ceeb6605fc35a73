"""What the launchers of loopback brokers share: a free port, a synchronous probe of a broker's
metadata, and a child process tied to this one whose output goes to a log file.

The Tansu launcher (:mod:`streams.testing.broker`) and the Apache Kafka one
(:mod:`streams.testing.apache_kafka`) build on these.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_METADATA = 3
_METADATA_VERSION = 4  # the oldest version every broker Relay supports still answers (KIP-896)


class BrokerError(RuntimeError):
    """A broker could not be found, installed, started or reached."""


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_loopback_ports(count: int) -> list[int]:
    """``count`` distinct free ports (held open together while picked, so none repeats)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


@dataclass(frozen=True)
class ClusterView:
    """What a broker's metadata answer says about its cluster."""

    cluster_id: str | None
    brokers: frozenset[int]


def cluster_view(host: str, port: int, timeout_s: float = 1.0) -> ClusterView | None:
    """Ask a broker for its metadata (Metadata v4, no topics); None when it does not answer.

    A raw request keeps this synchronous and free of any event loop, so it works from a
    pytest fixture, a CLI or inside a running asyncio application alike.
    """
    correlation_id = 0x5E1A
    client_id = b"relay-probe"
    body = struct.pack(">hhih", _METADATA, _METADATA_VERSION, correlation_id, len(client_id))
    body += client_id + struct.pack(">ib", 0, 0)  # no topics, no auto-creation
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = _recv_exact(sock, 4)
            if header is None:
                return None
            (size,) = struct.unpack(">i", header)
            answer = _recv_exact(sock, size)
    except OSError:
        return None
    if answer is None:
        return None
    try:
        return _parse_metadata(answer, correlation_id)
    except (struct.error, UnicodeDecodeError):
        return None


def metadata_answers(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True when the broker answers a metadata request."""
    return cluster_view(host, port, timeout_s) is not None


def _parse_metadata(answer: bytes, correlation_id: int) -> ClusterView | None:
    (answered_id,) = struct.unpack_from(">i", answer, 0)
    if answered_id != correlation_id:
        return None
    offset = 8  # correlation id, throttle time
    (count,) = struct.unpack_from(">i", answer, offset)
    offset += 4
    brokers = set()
    for _ in range(count):
        (node_id,) = struct.unpack_from(">i", answer, offset)
        brokers.add(node_id)
        _host, offset = _string(answer, offset + 4)
        offset += 4  # port
        _rack, offset = _string(answer, offset)
    cluster_id, offset = _string(answer, offset)
    return ClusterView(cluster_id, frozenset(brokers))


def _string(data: bytes, offset: int) -> tuple[str | None, int]:
    (length,) = struct.unpack_from(">h", data, offset)
    offset += 2
    if length < 0:
        return None, offset
    return data[offset:offset + length].decode(), offset + length


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


class ChildProcess:
    """A broker process tied to this one: the Linux parent-death signal and ``atexit`` stop
    it, so an interrupted run leaves no orphan behind. Its output goes to ``log_path``."""

    def __init__(self, name: str, command: Sequence[str], log_path: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.name = name
        self.command = list(command)
        self.log_path = log_path
        self.env = env or {}
        self.cwd = cwd
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def spawn(self) -> None:
        """Start the process and return at once."""
        if self.running:
            return
        with open(self.log_path, "ab") as log_out:
            self._process = subprocess.Popen(
                self.command,
                stdout=log_out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                cwd=self.cwd,
                preexec_fn=_die_with_parent,
            )
        atexit.register(self.stop)

    def wait_ready(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Wait until ``ready()``; raise :class:`BrokerError` with the tail of the log if the
        process exits first or the time runs out (and then stop it)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            process = self._process
            code = None if process is None else process.poll()
            if process is None or code is not None:
                self._process = None
                raise BrokerError(f"{self.name} exited at start with code {code}; the end of its "
                                  f"log ({self.log_path}):\n{self.log_tail()}")
            if ready():
                return
            time.sleep(0.05)
        self.stop()
        raise BrokerError(f"{self.name} did not become ready ({what}) within {timeout_s:.0f}s; "
                          f"the end of its log ({self.log_path}):\n{self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def signal(self, signum: int) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signum)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate (then kill after ``timeout_s``) and reap the process."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            process.terminate()
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        with contextlib.suppress(ValueError):
            atexit.unregister(self.stop)

    def kill(self) -> None:
        """SIGKILL and reap: a crash, as a fault test wants it."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        with contextlib.suppress(ValueError):
            atexit.unregister(self.stop)
