"""``relay remove-members`` reports what happened to the group, whatever the broker answered:
a member gone after the removal is removed (exit 0) even when the broker answered with an
error, as Tansu does for a departed leader it keeps; a member still there is a failure; an
instance still running is refused."""

from __future__ import annotations

import time

import pytest

from streams.kafka.membership import GroupMember
from tools.cli import (
    ToolError,
    refuse_leaving_none,
    refuse_running,
    removal_outcome,
    static_members,
)

UUID = "39a6908a-da3c-406a-bd44-ca779e506ffb"


def test_a_member_gone_after_an_error_answer_is_reported_removed() -> None:
    outcome = removal_outcome({"s1-thread-0": "UnknownMemberIdError", "s1-thread-1": None,
                               "s3-thread-0": "UnknownMemberIdError"}, {"s3-thread-0"})
    assert outcome["s1-thread-0"] == (
        True, "removed (no longer a member of the group; the broker answered "
              "UnknownMemberIdError)")
    assert outcome["s1-thread-1"] == (True, "removed")
    assert outcome["s3-thread-0"] == (
        False, "still a member of the group (the broker answered UnknownMemberIdError)")


def test_static_members_of_one_instance_or_of_all() -> None:
    members = [GroupMember(f"s1-thread-0-{UUID}", "app-s1-thread-0", "/h"),
               GroupMember(f"s12-thread-1-{UUID}", "app-s12-thread-1", "/h"),
               GroupMember(f"app-0-{UUID}", "app-0", "/h")]
    assert static_members(members, "app", "s1") == [(f"s1-thread-0-{UUID}", "s1-thread-0")]
    assert [s for _m, s in static_members(members, "app", "")] == ["s1-thread-0",
                                                                     "s12-thread-1"]


def test_an_instance_that_still_publishes_its_status_is_refused() -> None:
    now = time.time() * 1000
    status = {"api-7-thread-0": {"instance_id": "api-7", "updated_ms": now - 2_000},
              "api-7-thread-1": {"instance_id": "api-7", "updated_ms": now - 4_000},
              "api-8-thread-0": {"instance_id": "api-8", "updated_ms": now - 1_000},
              "api-6-thread-0": {"instance_id": "api-6", "updated_ms": now - 6_000}}
    with pytest.raises(ToolError) as refused:
        refuse_running("orders", ("api-7", "api-9"), status)
    assert refused.value.exit_code == 2
    message = refused.value.message
    assert message.startswith("api-7 (published its status 2 s ago) of orders looks alive")
    assert "relay mark-leaving orders api-7" in message and "--force" in message
    refuse_running("orders", ("api-9",), status)  # gone: nothing to refuse
    # Silent for 6 s (SIGKILLed, say): taken for gone, though its session may still run.
    refuse_running("orders", ("api-6",), status)


def test_a_mark_that_leaves_only_silent_instances_is_refused() -> None:
    now = time.time() * 1000
    status = {"node-a-thread-0": {"instance_id": "node-a", "updated_ms": now - 500},
              "node-b-thread-0": {"instance_id": "node-b", "updated_ms": now - 7_000}}
    with pytest.raises(ToolError) as refused:
        refuse_leaving_none("shop", ("node-a",), status)
    assert refused.value.exit_code == 2
    assert "silent for 5 s or more: node-b" in refused.value.message
    status["node-b-thread-0"]["updated_ms"] = now - 800
    refuse_leaving_none("shop", ("node-a",), status)  # node-b runs: it takes the tasks
    status["node-b-thread-0"]["leaving"] = True
    with pytest.raises(ToolError, match="already leaving: node-b"):
        refuse_leaving_none("shop", ("node-a",), status)
