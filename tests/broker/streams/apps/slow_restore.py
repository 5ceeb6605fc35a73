"""The counting app (:mod:`tests.broker.streams.apps.counting`) whose changelog readers apply
two records per fetch: its restores take seconds on any machine, as a big state's would."""

from __future__ import annotations

from typing import Any

from statestore.restore import ChangelogReader

_reader_init = ChangelogReader.__init__


def _few_records(self: ChangelogReader, *args: Any, **kwargs: Any) -> None:
    _reader_init(self, *args, **{**kwargs, "max_records": 2})


ChangelogReader.__init__ = _few_records  # type: ignore[method-assign]

from tests.broker.streams.apps.counting import app  # noqa: E402

__all__ = ["app"]
