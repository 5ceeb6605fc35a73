"""The embedded protocol: encodings round-trip, refuse corrupt or foreign bytes with clear
errors, and stay small at 10,000 tasks and 500 members."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from assignor import (
    AssignorConfig,
    AssignorConfigError,
    LeaderNotes,
    MemberAssignment,
    MemberNotes,
)
from assignor.model import task_sort_key
from assignor.protocol import (
    ProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    decode_subscription_or_none,
    encode_assignment,
    encode_subscription,
    member_from_subscription,
    with_echo,
)

task_ids = st.builds(lambda s, p: f"{s}_{p}", st.integers(0, 20), st.integers(0, 300))
lags = st.dictionaries(task_ids, st.integers(0, 2**40), max_size=20)
optional_ms = st.none() | st.integers(0, 2**45)

subscriptions = st.builds(
    Subscription,
    instance_id=st.text(min_size=1, max_size=30), thread=st.integers(0, 64),
    pid=st.integers(1, 2**22),
    active=st.lists(task_ids, max_size=30, unique=True).map(
        lambda ts: tuple(sorted(ts, key=task_sort_key))),
    standbys=lags, learners=lags, leaving=st.booleans(), leaving_since_ms=optional_ms,
    scale_down_timeout_ms=optional_ms, rejoin_token=st.integers(0, 2**31),
    asks_promotion=st.booleans(),
    ready_by_assignment=st.lists(task_ids, max_size=5).map(
        lambda ts: tuple(sorted(set(ts), key=task_sort_key))),
)


def sorted_tasks(tasks: list[str]) -> tuple[str, ...]:
    return tuple(sorted(set(tasks), key=task_sort_key))


assignments = st.builds(
    MemberAssignment,
    active=st.lists(task_ids, max_size=30).map(sorted_tasks),
    being_learned=st.lists(task_ids, max_size=5).map(sorted_tasks),
    learners=st.lists(task_ids, max_size=5).map(sorted_tasks),
    standbys=st.lists(task_ids, max_size=30).map(sorted_tasks),
    revoked=st.lists(task_ids, max_size=5).map(sorted_tasks),
    rejoin_after_ms=optional_ms, shutdown=st.booleans(),
    error=st.none() | st.text(max_size=40), group_size=st.integers(0, 2**16),
    group_learners=st.integers(0, 2**16),
)


@given(subscriptions)
def test_subscription_round_trip(sub: Subscription) -> None:
    decoded = decode_subscription(encode_subscription(sub))
    assert decoded == Subscription(**{**sub.__dict__, "standbys": dict(sub.standbys),
                                      "learners": dict(sub.learners)})


@given(assignments)
def test_assignment_round_trip(assignment: MemberAssignment) -> None:
    assert decode_assignment(encode_assignment(assignment)) == assignment


@pytest.mark.parametrize(("data", "message"), [
    (b"", "too short"),
    (None, "too short"),
    (b"\x07\x00\x80", "format version 7"),
    (b"\x01\x05\x80", "unknown compression 5"),
    (b"\x01\x01garbage", "corrupt compressed body"),
    (b"\x01\x00\xc1", "corrupt msgpack"),
    (b"\x01\x00\x93\x01\x02\x03", "body is list"),
])
def test_corrupt_bytes_are_refused(data: bytes | None, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_subscription(data)
    with pytest.raises(ProtocolError, match=message):
        decode_assignment(data)


def test_wrong_field_types_are_refused() -> None:
    good = encode_subscription(Subscription("i", 0, 1))
    import msgpack

    payload = msgpack.unpackb(good[2:], raw=False, strict_map_key=False)
    payload["t"] = "zero"
    with pytest.raises(ProtocolError, match="field 't'"):
        decode_subscription(good[:2] + msgpack.packb(payload))
    payload["t"], payload["a"] = 0, {0: ["x"]}
    with pytest.raises(ProtocolError, match="bad task"):
        decode_subscription(good[:2] + msgpack.packb(payload))
    payload["a"], payload["R"] = {}, ["0_1"]
    with pytest.raises(ProtocolError, match="task list must be a map"):
        decode_subscription(good[:2] + msgpack.packb(payload))
    # A corrupt byte can make a sub-topology key a boolean, which msgpack gives as an int:
    # still no task (there is no task True_1).
    del payload["R"]
    for field, value in (("a", {True: [1]}), ("R", {True: [1]}), ("s", {True: [[4, 5]]}),
                         ("l", {False: [[2, 0]]})):
        with pytest.raises(ProtocolError, match="sub-topology"):
            decode_subscription(good[:2] + msgpack.packb({**payload, field: value}))


def test_a_member_vouches_only_for_learners_it_holds() -> None:
    sub = Subscription("i", 0, 1, learners={"0_1": 50_000}, ready_by_assignment=("0_1", "0_2"))
    member = member_from_subscription("m", decode_subscription(encode_subscription(sub)))
    assert member.ready_by_assignment == {"0_1"}
    # Said by no one, the field is left out: older leaders read the same bytes as before.
    import msgpack

    plain = encode_subscription(Subscription("i", 0, 1))
    assert "R" not in msgpack.unpackb(plain[2:], raw=False, strict_map_key=False)


@given(st.binary(max_size=200))
def test_random_bytes_never_crash_the_decoder(data: bytes) -> None:
    """Bytes it cannot read are a ProtocolError that says why, nothing else."""
    try:
        decode_subscription(data)
    except ProtocolError as exc:
        assert str(exc).strip(), "a ProtocolError without a message"


def test_the_leader_treats_undecodable_metadata_as_a_new_member(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        assert decode_subscription_or_none("member-7", b"\x01\x00\xc1") is None
    assert "member-7" in caplog.text and "new member" in caplog.text


def test_group_metadata_stays_small_at_scale() -> None:
    tasks = [f"{s}_{p}" for s in range(10) for p in range(1000)]
    members = 500
    total = 0
    for m in range(members):
        mine = tasks[m::members]
        sub = Subscription(f"instance-{m // 5}", m % 5, 10_000 + m, tuple(mine),
                           {t: 12_345 for t in tasks[(m + 1) % members::members]}, {})
        total += len(encode_subscription(sub))
        total += len(encode_assignment(MemberAssignment(active=tuple(mine))))
    assert total < 1024 * 1024 / 2, f"{total} bytes for {members} members"


notes = st.builds(
    LeaderNotes,
    round_ms=st.integers(0, 2**45), formed_at_ms=optional_ms,
    members=st.dictionaries(
        st.tuples(st.text(min_size=1, max_size=10), st.integers(0, 16)),
        st.builds(MemberNotes,
                  owned=st.lists(task_ids, max_size=20).map(sorted_tasks),
                  incoming=st.lists(task_ids, max_size=5).map(sorted_tasks),
                  held=st.dictionaries(task_ids, st.integers(0, 2**45), max_size=5)),
        max_size=3),
)


@given(notes)
def test_leader_notes_round_trip_in_assignments_and_subscriptions(note: LeaderNotes) -> None:
    assert decode_assignment(encode_assignment(MemberAssignment(notes=note))).notes == note
    echoed = with_echo(Subscription("i", 0, 1), MemberAssignment(notes=note))
    assert decode_subscription(encode_subscription(echoed)).notes == note
    member = member_from_subscription("m", decode_subscription(encode_subscription(echoed)))
    assert member.notes == note


def test_an_older_subscription_without_notes_still_decodes() -> None:
    import msgpack

    older = {"i": "node-1", "t": 0, "p": 42, "a": {0: [1, 3]}, "s": {1: [[2, 7]]}, "l": {},
             "L": False, "ls": None, "st": None, "r": 3, "h": "", "S": True}
    sub = decode_subscription(b"\x01\x00" + msgpack.packb(older))
    assert sub.active == ("0_1", "0_3") and sub.standbys == {"1_2": 7}
    assert sub.notes is None
    assert with_echo(sub, None).notes is None
    # An older member asks for a round on each ready learner: its rounds promote them.
    assert sub.asks_promotion


def test_corrupt_notes_are_dropped_with_a_warning_and_the_rest_decodes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import msgpack

    good = encode_subscription(Subscription("i", 0, 1, active=("0_1",)))
    payload = msgpack.unpackb(good[2:], raw=False, strict_map_key=False)
    for corrupt, message in (({"r": 1, "m": [["i", 0]]}, "leader notes entry"),
                             ({"r": 1, "m": [["i", 0, {0: b"\x80"}, {}, []]]},
                              "middle of a number"),
                             ({"m": []}, "field 'r'")):
        payload["n"] = corrupt
        with caplog.at_level(logging.WARNING):
            sub = decode_subscription(good[:2] + msgpack.packb(payload))
        assert sub.notes is None and sub.active == ("0_1",)
        assert message in caplog.text and "ignoring the leader's notes" in caplog.text
        caplog.clear()


def test_assignor_settings_are_validated_naming_the_setting() -> None:
    with pytest.raises(AssignorConfigError, match="imbalance_tolerance") as caught:
        AssignorConfig(imbalance_tolerance=0)
    assert caught.value.setting == "imbalance_tolerance"
    assert isinstance(caught.value, ValueError)
    with pytest.raises(AssignorConfigError, match="max_learners") as caught:
        AssignorConfig.from_settings(SimpleNamespace(max_learners=0, num_standbys=1))
    assert caught.value.setting == "max_learners"
    with pytest.raises(AssignorConfigError, match="num_standbys"):
        AssignorConfig(num_standbys="2")  # type: ignore[arg-type]
    settings = SimpleNamespace(num_standbys=1, max_learners=3, imbalance_tolerance=None,
                               application_id="not an assignor setting")
    assert AssignorConfig.from_settings(settings) == AssignorConfig(num_standbys=1,
                                                                    max_learners=3)


def test_group_metadata_with_the_leaders_notes_stays_under_1_mib_at_50000_tasks() -> None:
    """Every subscription (echoing its notes) and every assignment of a group of 1,608
    members after one instance joined 50,000 tasks with one standby each."""
    from benchmarks.assignor import measure

    result = measure(50_000, 200, 8, 10, AssignorConfig(num_standbys=1), repeat=1)
    assert result["members"] == 1_608
    assert result["metadata_bytes"] < 2**20, result["metadata_bytes"]


def test_fields_older_members_read_keep_their_layout() -> None:
    """Only the notes (a field older members ignore) use the compact layout: an older leader
    still reads a new member's tasks and lags, and an older member its assignment."""
    import zlib

    import msgpack

    note = LeaderNotes(round_ms=5, members={("b", 0): MemberNotes(owned=("0_1", "0_300"))})
    sub = encode_subscription(Subscription("a", 0, 1, ("0_2", "1_7"), {"0_3": 4}, {"2_1": 9},
                                           notes=note))
    assignment = encode_assignment(MemberAssignment(active=("0_2",), standbys=("0_3",),
                                                    notes=note))
    for data, keys in ((sub, "asl"), (assignment, "ablsr")):
        body = zlib.decompress(data[2:]) if data[1] == 1 else data[2:]
        payload = msgpack.unpackb(body, raw=False, strict_map_key=False)
        for key in keys:
            for value in payload.get(key, {}).values():
                assert isinstance(value, list), (key, value)
        assert isinstance(payload["n"]["m"][0][2][0], bytes)
    decoded = decode_subscription(sub)
    assert decoded.active == ("0_2", "1_7") and decoded.learners == {"2_1": 9}
