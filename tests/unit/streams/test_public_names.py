"""The public API: every name ``streams`` exports imports, the DSL's return types among
them, and the DSL page lists each one."""

from __future__ import annotations

import re
from pathlib import Path

import streams

DSL_PAGE = Path(__file__).resolve().parents[3] / "docs" / "dsl.md"


def test_every_public_name_imports_and_the_dsl_page_lists_it() -> None:
    text = " ".join(DSL_PAGE.read_text().split())
    listed = re.search(r"imports the public names \(([^)]*)\)", text)
    assert listed is not None
    documented = set(re.findall(r"`(\w+)`", listed.group(1)))
    assert documented == set(streams.__all__)
    for name in streams.__all__:
        assert getattr(streams, name).__name__ == name


def test_what_app_global_table_returns_is_public() -> None:
    app = streams.App("public-names", bootstrap_servers="127.0.0.1:1")
    assert isinstance(app.global_table("pages", store="pages"), streams.GlobalTable)
