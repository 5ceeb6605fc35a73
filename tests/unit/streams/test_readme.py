"""The README and the docs pages run as written: the README's word-count app with its test,
and every example on a page that uses the topology test driver (each one asserts what its page
says it does). No broker: the driver runs the topology in process.

A block that starts with ``# name.py`` is a file: the README's ``test_wordcount.py`` imports
``wordcount.py`` from beside it, as a user's test would."""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def block_named(name: str, page: Path = README) -> str:
    (block,) = [b for b in python_blocks(page) if b.startswith(f"# {name}\n")]
    return block


def driver_examples() -> list[tuple[str, str]]:
    """(where, code) of every block that drives a topology and is not a test file needing
    its app module beside it."""
    return [(f"{page.relative_to(ROOT)} example {n}", block)
            for page in [README, *PAGES]
            for n, block in enumerate(python_blocks(page))
            if "TopologyTestDriver" in block and not block.startswith("# test_")]


def run_tests_of(code: str, filename: str) -> int:
    namespace: dict[str, object] = {}
    exec(compile(code, filename, "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    for test in tests:
        test()
    return len(tests)


def test_the_readme_word_count_app_and_its_test(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "wordcount.py").write_text(block_named("wordcount.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "wordcount", raising=False)
    assert run_tests_of(block_named("test_wordcount.py"), "test_wordcount.py") == 1


def test_the_readme_test_fails_when_the_app_counts_wrong(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's test checks the app: an app that drops one word fails it."""
    app = block_named("wordcount.py").replace(
        ".flat_map_values(str.split)", ".flat_map_values(lambda line: line.split()[1:])")
    assert "line.split()[1:]" in app
    (tmp_path / "wordcount.py").write_text(app)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "wordcount", raising=False)
    with pytest.raises(AssertionError):
        run_tests_of(block_named("test_wordcount.py"), "test_wordcount.py")


@pytest.mark.parametrize(("where", "code"), driver_examples(), ids=lambda v: v[:40])
def test_each_driver_example(where: str, code: str) -> None:
    exec(compile(code, where, "exec"), {})


def test_the_docs_have_driver_examples() -> None:
    assert len(driver_examples()) >= 2


def test_the_failover_example_sets_what_its_page_says(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from streams.testing import TopologyTestDriver

    (tmp_path / "failover.py").write_text(block_named("failover.py", ROOT / "docs/migration.md"))
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


def slug(heading: str) -> str:
    """A heading's anchor as the docs site makes it (Python-Markdown's toc)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_the_readme_links_name_pages_and_headings_that_exist() -> None:
    """The docs site's strict build checks the links between pages; the README is not part of
    the site, so its links to the pages are checked here."""
    links = re.findall(r"\]\(([^)#:]+\.md)(?:#([^)]+))?\)", README.read_text())
    assert links
    for target, anchor in links:
        page = ROOT / target
        assert page.is_file(), f"README links {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)
            assert anchor in {slug(h) for h in headings}, f"no heading #{anchor} in {target}"


def test_the_readme_stays_a_front_page() -> None:
    assert len(README.read_text().splitlines()) < 250
