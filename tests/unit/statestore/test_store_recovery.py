"""A damaged or failing store, without a broker: wiped with a warning naming it, a failing
checkpoint write a store write error."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from statestore.checkpoint import checkpoint_path, read_checkpoint
from statestore.errors import StoreWriteError
from tests.broker.statestore.test_store_recovery import DAMAGE, committed_by_hand, task_store


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_store_is_wiped_with_a_warning_naming_it(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = task_store(tmp_path, "app")
    committed_by_hand(store, {f"k{i}": i for i in range(200)})
    directory = store.directory
    store.close()
    assert checkpoint_path(directory).exists()
    DAMAGE[damage](directory)

    with caplog.at_level(logging.WARNING, logger="statestore"):
        reopened = task_store(tmp_path, "app")
    assert str(directory) in caplog.text
    assert "in full" in caplog.text
    # Nothing of the damaged state is trusted: restoration starts at the changelog's start.
    assert reopened.position == 0 and not reopened.has_checkpoint
    assert list(reopened.items()) == []
    reopened.close()


def test_a_failing_checkpoint_write_is_a_store_write_error(tmp_path: Path) -> None:
    store = task_store(tmp_path, "app")
    committed_by_hand(store, {"a": 1})
    # Something where the checkpoint's temporary file goes: writing it fails (even as root).
    blocker = checkpoint_path(store.directory)
    blocker.with_suffix(blocker.suffix + ".tmp").mkdir()
    store.put("a", 2)
    sent = store.drain_changelog()
    store.acknowledged(store.position + len(sent), len(sent))
    with pytest.raises(StoreWriteError, match=r"store counts\[0\] at .*commit failed"):
        store.commit()
    store.close()


def test_a_store_without_checkpoint_warns_only_when_it_held_data(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    empty, full = tmp_path / "empty", tmp_path / "full"
    empty.mkdir()
    full.mkdir()
    (full / "000012.sst").write_bytes(b"data")
    with caplog.at_level(logging.INFO, logger="statestore.checkpoint"):
        assert read_checkpoint(empty, "app-counts-changelog", 0) is None
        assert read_checkpoint(full, "app-counts-changelog", 0) is None
    levels = {r.levelname for r in caplog.records if r.name == "statestore.checkpoint"
              and "empty" in r.getMessage()}
    assert levels == {"INFO"}
    levels = {r.levelname for r in caplog.records if r.name == "statestore.checkpoint"
              and "full" in r.getMessage()}
    assert levels == {"WARNING"}
