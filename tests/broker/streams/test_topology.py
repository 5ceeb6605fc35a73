"""Importing the package stays light, checked in a fresh interpreter (a subprocess)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_package_stays_light() -> None:
    code = ("import sys, streams; heavy = [m for m in sys.modules if m.split('.')[0] in "
            "('aiokafka', 'rocksdict', 'msgpack')]; assert not heavy, heavy; "
            "from streams import App, TumblingWindows, TopologyTestDriver, Windowed; "
            "assert App.__module__ == 'streams.app'")
    subprocess.run([sys.executable, "-c", code], check=True)
