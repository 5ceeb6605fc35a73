"""The embedded protocol: encodings round-trip, refuse corrupt or foreign bytes with clear
errors, and stay small at 10,000 tasks and 500 members."""

from __future__ import annotations

import contextlib
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from assignor import MemberAssignment
from assignor.protocol import (
    ProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    decode_subscription_or_none,
    encode_assignment,
    encode_subscription,
)

task_ids = st.builds(lambda s, p: f"{s}_{p}", st.integers(0, 20), st.integers(0, 300))
lags = st.dictionaries(task_ids, st.integers(0, 2**40), max_size=20)
optional_ms = st.none() | st.integers(0, 2**45)

subscriptions = st.builds(
    Subscription,
    instance_id=st.text(min_size=1, max_size=30), thread=st.integers(0, 64),
    pid=st.integers(1, 2**22),
    active=st.lists(task_ids, max_size=30, unique=True).map(
        lambda ts: tuple(sorted(ts, key=lambda t: tuple(map(int, t.split("_")))))),
    standbys=lags, learners=lags, leaving=st.booleans(), leaving_since_ms=optional_ms,
    scale_down_timeout_ms=optional_ms, rejoin_token=st.integers(0, 2**31),
    topology_hash=st.text(max_size=12),
)


def sorted_tasks(tasks: list[str]) -> tuple[str, ...]:
    return tuple(sorted(set(tasks), key=lambda t: tuple(map(int, t.split("_")))))


assignments = st.builds(
    MemberAssignment,
    active=st.lists(task_ids, max_size=30).map(sorted_tasks),
    being_learned=st.lists(task_ids, max_size=5).map(sorted_tasks),
    learners=st.lists(task_ids, max_size=5).map(sorted_tasks),
    standbys=st.lists(task_ids, max_size=30).map(sorted_tasks),
    revoked=st.lists(task_ids, max_size=5).map(sorted_tasks),
    rejoin_after_ms=optional_ms, shutdown=st.booleans(),
    error=st.none() | st.text(max_size=40),
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


@given(st.binary(max_size=200))
def test_random_bytes_never_crash_the_decoder(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_subscription(data)


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
