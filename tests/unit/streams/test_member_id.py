"""A thread's member id, built and parsed in one place."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.group.member_id import (
    instance_member_ids,
    instance_of,
    parse_member_id,
    static_id_of,
    thread_id_in,
    thread_member_id,
)


def test_a_member_id_names_its_instance_and_thread() -> None:
    assert thread_member_id("node-a", 2) == "node-a-thread-2"
    assert parse_member_id("node-a-thread-2") == ("node-a", 2)
    assert instance_member_ids("n", 2) == {"n-thread-0", "n-thread-1"}
    assert instance_of("node-a-thread-0") == "node-a"


def test_text_that_is_no_member_id_parses_to_nothing() -> None:
    for text in ("node-a", "node-a-thread-", "-thread-1", "node-a-thread-x"):
        assert parse_member_id(text) is None
    assert instance_of("node-a") == "node-a"


@given(st.text(min_size=1), st.integers(min_value=0, max_value=10_000))
def test_parsing_undoes_building(instance: str, index: int) -> None:
    assert parse_member_id(thread_member_id(instance, index)) == (instance, index)


def test_the_brokers_id_of_a_static_member_holds_its_member_id() -> None:
    uuid = "0f8fad5b-d9cb-469f-a165-70867728950e"
    assert static_id_of(f"node-a-thread-0-{uuid}") == "node-a-thread-0"
    assert static_id_of(f"app-0-{uuid}") is None


def test_a_members_other_names_give_its_thread_member_id() -> None:
    uuid = "0f8fad5b-d9cb-469f-a165-70867728950e"
    assert thread_id_in("node-a-thread-0") == "node-a-thread-0"  # its group instance id
    assert thread_id_in(f"node-a-thread-1-{uuid}") == "node-a-thread-1"  # its broker id
    assert thread_id_in("shop-node-a-thread-2", "shop") == "node-a-thread-2"  # its client id
    for other in ("shop-0", f"shop-0-{uuid}", "node-a", ""):
        assert thread_id_in(other, "shop") is None
