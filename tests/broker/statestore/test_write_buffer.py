"""The write buffer across a process killed before its commit (a subprocess)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.unit.statestore.test_write_buffer import TOPIC, open_store


def test_a_process_killed_before_its_commit_leaves_the_last_commit_on_disk(
    tmp_path: Path,
) -> None:
    """The database never holds a write its changelog might not have: writes since the last
    commit do not reach RocksDB, whatever RocksDB or the OS had buffered when SIGKILL came."""
    directory = tmp_path / "counts"
    killed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(f"""
            import os, signal
            from statestore.store import KeyValueStore, StoreSpec
            store = KeyValueStore(StoreSpec("counts"), {str(directory)!r}, {TOPIC!r}, 0).open()
            store.put("a", 1)
            sent = store.drain_changelog()
            store.acknowledged(len(sent), len(sent))
            store.commit()
            store.put("a", 2)
            store.put("b", 1)
            store.drain_changelog()  # sent, never acknowledged
            os.kill(os.getpid(), signal.SIGKILL)
        """)],
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL
    reopened = open_store(directory)
    assert dict(reopened.items()) == {"a": 1}
    assert reopened.position == 1
    reopened.close()
