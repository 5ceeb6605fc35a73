"""``relay remove-members`` reports what happened to the group, whatever the broker answered:
a member gone after the removal is removed (exit 0) even when the broker answered with an
error, as Tansu does for a departed leader it keeps; a member still there is a failure."""

from __future__ import annotations

from streams.kafka.membership import GroupMember
from tools.cli import removal_outcome, static_members

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
