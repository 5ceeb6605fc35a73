"""The client of the Kafka Streams oracle: one JVM, fed one JSON request per line over a pipe,
answering one JSON line each."""

from __future__ import annotations

import json
import subprocess
import tempfile
from typing import Any

from benchmarks.peers.kafka_streams import java_command


class OracleError(RuntimeError):
    """The oracle could not run a request, or died."""


class Oracle:
    def __init__(self) -> None:
        # Open as long as the JVM runs; read back when it dies, closed in close().
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self._process = subprocess.Popen(
            java_command("Oracle", heap="256m"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, text=True, bufsize=1)
        self.requests = 0

    def run(self, topology: dict[str, Any], records: list[dict[str, Any]]
            ) -> dict[str, list[list[Any]]]:
        """Every record the topology wrote, per output topic: ``[key, value, timestamp]``,
        a windowed key as ``[key, start, end]``."""
        assert self._process.stdin is not None and self._process.stdout is not None
        request = json.dumps({"topology": topology, "records": records})
        try:
            self._process.stdin.write(request + "\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            raise OracleError(f"the oracle died: {self._last_error()}") from None
        line = self._process.stdout.readline()
        if not line:
            raise OracleError(f"the oracle died: {self._last_error()}")
        self.requests += 1
        answer = json.loads(line)
        if "error" in answer:
            raise OracleError(f"the oracle failed: {answer['error']}")
        return answer["outputs"]

    def _last_error(self) -> str:
        self._stderr.seek(0)
        lines = self._stderr.read().strip().splitlines()
        return lines[-1] if lines else f"exit code {self._process.poll()}"

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._stderr.close()
