"""What a process that runs an app imports before it joins its group (no broker)."""

from __future__ import annotations

import subprocess
import sys


def test_an_app_without_a_query_port_never_imports_the_http_server() -> None:
    # aiohttp was half of the imports of a worker's start, which a static member restarting
    # within its session keeps its tasks waiting for; only a query server needs it.
    code = ("import sys, streams, streams.run_command\n"
            "from streams.app import App\n"
            "app = App('unit', bootstrap_servers='127.0.0.1:1')\n"
            "app.stream('in').to('out')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'aiohttp'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"
