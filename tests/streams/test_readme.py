"""The README's examples run as written: the word-count app with its test, and every example
that uses the topology test driver (each one asserts what the README says it does)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def block_named(name: str) -> str:
    (block,) = [b for b in python_blocks() if b.startswith(f"# {name}\n")]
    return block


def driver_examples() -> list[str]:
    return [b for b in python_blocks()
            if "TopologyTestDriver" in b and not b.startswith("# test_wordcount.py")]


def test_the_word_count_example_and_its_test(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "wordcount.py").write_text(block_named("wordcount.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "wordcount", raising=False)
    namespace: dict[str, object] = {}
    exec(compile(block_named("test_wordcount.py"), "test_wordcount.py", "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    assert tests
    for test in tests:
        test()


@pytest.mark.parametrize("index", range(len(driver_examples())))
def test_each_driver_example(index: int) -> None:
    exec(compile(driver_examples()[index], f"README example {index}", "exec"), {})


def test_the_readme_has_driver_examples() -> None:
    assert len(driver_examples()) >= 2


def test_the_failover_example_sets_what_the_readme_says(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from streams.testing import TopologyTestDriver

    (tmp_path / "failover.py").write_text(block_named("failover.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "failover", raising=False)
    from failover import app  # type: ignore[import-not-found]

    config = app.config
    assert (config.session_timeout_ms, config.heartbeat_interval_ms, config.num_standbys,
            config.lost_task_delay_ms) == (10_000, 1_000, 1, 0)
    with TopologyTestDriver(app) as driver:
        driver.pipe("orders", "ann", {"amount": 5})
        driver.pipe("orders", "ann", {"amount": 7})
        assert driver.read_key_value_map("order-counts") == {"ann": 2}
