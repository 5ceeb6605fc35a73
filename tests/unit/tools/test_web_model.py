"""The web view's model without a broker: status and control records in, the view's data out."""

from __future__ import annotations

import json
from typing import Any

from streams.group.control import LeavingMark
from tools.web.model import (
    STALE_AFTER_MS,
    GroupModel,
    MarkRecord,
    StatusRecord,
    group_view,
    parse_status,
)

ACCEPT = 100


def status(instance: str, thread: int = 0, *, active: tuple[str, ...] = (),
           learners: dict[str, int] | None = None, standbys: dict[str, int] | None = None,
           restoring: tuple[str, ...] = (), leader: bool = False, leaving: bool = False,
           generation: int = 1, rebalances: int = 1, at: int = 0,
           **extra: Any) -> StatusRecord:
    member = f"{instance}-thread-{thread}"
    value = {
        "instance_id": instance, "thread": thread, "static_id": member, "pid": 4242,
        "incarnation": "x", "member_id": f"{member}-abc", "generation": generation,
        "leader": leader, "active": list(active), "restoring": list(restoring),
        "standbys": standbys or {}, "learners": learners or {}, "acceptable_lag": ACCEPT,
        "leaving": leaving, "leaving_since_ms": 5_000 if leaving else None,
        "rebalances": rebalances, "processed": 10, "restored_records": 0, "updated_ms": at,
        **extra,
    }
    return StatusRecord(member, value, at)


def task(view: dict[str, Any], task_id: str) -> dict[str, Any]:
    return next(t for t in view["tasks"] if t["task"] == task_id)


def kinds(view: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in view["timeline"] if e["kind"] == kind]


def test_members_grouped_by_instance_with_static_ids_and_the_leader() -> None:
    view = group_view("app", [
        status("node-a", 0, active=("0_0",), leader=True, at=1_000),
        status("node-a", 1, active=("0_1",), at=1_000),
        status("node-b", 0, active=("0_2", "0_3"), at=1_100),
    ], now_ms=2_000)
    assert view["leader"] == "node-a-thread-0"
    assert [i["instance_id"] for i in view["instances"]] == ["node-a", "node-b"]
    threads = view["instances"][0]["threads"]
    assert [(t["static_id"], t["thread"], t["leader"]) for t in threads] == [
        ("node-a-thread-0", 0, True), ("node-a-thread-1", 1, False)]
    assert [t["task"] for t in view["tasks"]] == ["0_0", "0_1", "0_2", "0_3"]
    assert {t["task"]: t["active"] for t in view["tasks"]} == {
        "0_0": "node-a-thread-0", "0_1": "node-a-thread-1", "0_2": "node-b-thread-0",
        "0_3": "node-b-thread-0"}
    json.dumps(view)  # plain JSON types only


def test_a_scale_down_seen_step_by_step() -> None:
    model = GroupModel("app")
    model.apply(status("a", active=("0_0", "0_1"), at=1_000))
    model.apply(status("b", active=("0_2", "0_3"), at=1_000))
    model.apply(MarkRecord("b", LeavingMark(5_000, 60_000), 5_200))
    model.apply(status("b", active=("0_2", "0_3"), leaving=True, rebalances=2, generation=2,
                       at=12_000))
    model.apply(status("a", active=("0_0", "0_1"), learners={"0_2": 1_000}, rebalances=2,
                       generation=2, at=12_500))

    view = model.view(13_000)
    assert view["leaving"] == [{
        "instance": "b", "since_ms": 5_000, "timeout_ms": 60_000, "marked_ms": 5_200,
        "source": "mark", "acknowledged": True, "state": "handing over", "deadline_ms": 65_000,
        "remaining_ms": 52_000,
    }]
    assert view["instances"][1]["leaving"] is True
    learning = task(view, "0_2")
    assert learning["active"] == "b-thread-0"
    assert learning["beingLearned"] is True and learning["isStateful"] is True
    assert learning["tags"] == ["isStateful", "beingLearned"]
    (learner,) = learning["learners"]
    assert learner == {"member": "a-thread-0", "instance": "a", "role": "learner", "lag": 1_000,
                       "acceptable_lag": ACCEPT, "peak_lag": 1_000, "progress": 0.0,
                       "isLearner": True, "isReady": False, "stale": False,
                       "catch_up_per_s": None, "ready_in_ms": None}
    assert task(view, "0_3")["isStateful"] is None  # no copy seen: unknown, not stateless
    assert task(view, "0_3")["beingLearned"] is False
    (round_,) = kinds(view, "rebalance")
    assert round_["members"] == ["b-thread-0", "a-thread-0"] and round_["generation"] == 2

    model.apply(status("a", active=("0_0", "0_1"), learners={"0_2": 80}, rebalances=2,
                       generation=2, at=14_000))
    view = model.view(14_000)
    (learner,) = task(view, "0_2")["learners"]
    assert learner["isReady"] is True and learner["progress"] == 0.92
    assert [e["task"] for e in kinds(view, "ready")] == ["0_2"]

    # Round one: b lets go of 0_2; round two: a runs it.
    model.apply(status("b", active=("0_3",), leaving=True, rebalances=3, generation=3,
                       at=20_000))
    unassigned = task(model.view(21_000), "0_2")
    assert unassigned["active"] is None and unassigned["unassigned_since_ms"] == 20_000
    assert unassigned["previous_active"] == "b-thread-0"
    model.apply(status("a", active=("0_0", "0_1", "0_2"), rebalances=4, generation=4,
                       at=27_000))
    view = model.view(27_500)
    moved = task(view, "0_2")
    assert moved["active"] == "a-thread-0" and moved["learners"] == []
    assert moved["beingLearned"] is False and moved["isStateful"] is True
    (move,) = kinds(view, "moved")
    assert move["members"] == ["b-thread-0", "a-thread-0"]
    (lane,) = [lane for lane in view["lanes"] if lane["task"] == "0_2"]
    assert [(s["member"], s["role"], s["start_ms"], s["end_ms"], s["open"])
            for s in lane["spans"]] == [
        ("b-thread-0", "active", 1_000, 20_000, False),
        ("a-thread-0", "learner", 12_500, 27_000, False),
        ("a-thread-0", "active", 27_000, 27_500, True),
    ]
    assert move["cause"] == "scale-down" and move["gap_ms"] == 7_000

    # b hands over its last task, leaves and deletes its mark before a runs the task: the
    # move is still the scale-down's.
    model.apply(status("b", active=(), leaving=True, rebalances=4, generation=4, at=28_000))
    model.apply(StatusRecord("b-thread-0", None, 29_000))
    model.apply(MarkRecord("b", None, 29_100))
    model.apply(status("a", active=("0_0", "0_1", "0_2", "0_3"), rebalances=5, generation=5,
                       at=35_000))
    view = model.view(37_000)
    assert [i["instance_id"] for i in view["instances"]] == ["a"]
    assert view["leaving"] == []
    assert {t["active"] for t in view["tasks"]} == {"a-thread-0"}
    assert [e["kind"] for e in view["timeline"]][-4:] == ["left", "unmarked", "rebalance",
                                                           "moved"]
    assert [(e["task"], e["cause"], e["gap_ms"]) for e in kinds(view, "moved")] == [
        ("0_2", "scale-down", 7_000), ("0_3", "scale-down", 7_000)]


def test_a_leaving_member_that_stops_while_listing_its_tasks_hands_them_to_the_scale_down(
) -> None:
    """A leaving member's tombstone (a clean stop) can arrive before its record without the
    tasks it handed over, and before the record of the member taking them: the moves are
    the scale-down's, not failovers."""
    model = GroupModel("app")
    model.apply(status("a", active=("0_0",), learners={"0_1": 0}, at=1_000))
    model.apply(status("b", active=("0_1",), leaving=True, at=1_000))
    model.apply(StatusRecord("b-thread-0", None, 1_500))
    assert task(model.view(1_600), "0_1")["previous_active"] == "b-thread-0"
    model.apply(status("a", active=("0_0", "0_1"), rebalances=2, generation=2, at=1_800))
    (move,) = kinds(model.view(2_000), "moved")
    assert (move["task"], move["cause"], move["gap_ms"]) == ("0_1", "scale-down", 300)


def test_a_marked_member_that_stops_hands_its_tasks_to_the_scale_down() -> None:
    """Marked, but stopped before its status said it was leaving; its mark deleted before
    the takeover."""
    model = GroupModel("app")
    model.apply(status("a", active=("0_0",), at=1_000))
    model.apply(status("b", active=("0_1",), at=1_000))
    model.apply(MarkRecord("b", LeavingMark(1_100, 60_000), 1_200))
    model.apply(StatusRecord("b-thread-0", None, 1_500))
    model.apply(MarkRecord("b", None, 1_600))
    model.apply(status("a", active=("0_0", "0_1"), rebalances=2, generation=2, at=1_800))
    (move,) = kinds(model.view(2_000), "moved")
    assert move["cause"] == "scale-down"


def test_a_member_back_from_leaving_that_stops_again_fails_over() -> None:
    model = GroupModel("app")
    model.apply(status("a", active=("0_0",), at=1_000))
    model.apply(status("b", active=("0_1",), leaving=True, at=1_000))
    model.apply(StatusRecord("b-thread-0", None, 1_500))
    model.apply(status("b", active=("0_1",), at=2_000))  # restarted, not leaving
    model.apply(StatusRecord("b-thread-0", None, 2_500))
    model.apply(status("a", active=("0_0", "0_1"), rebalances=2, generation=2, at=2_800))
    (move,) = kinds(model.view(3_000), "moved")
    assert move["cause"] == "failover"


def test_a_leaving_mark_is_folded_in_once() -> None:
    folded: list[MarkRecord] = []

    class Counting(GroupModel):
        def _apply_mark(self, record: MarkRecord) -> None:
            folded.append(record)
            super()._apply_mark(record)

    model = Counting("app")
    marked, unmarked = MarkRecord("b", LeavingMark(1_100, 60_000), 1_200), MarkRecord(
        "b", None, 1_300)
    model.apply(marked)
    model.apply(unmarked)
    assert folded == [marked, unmarked]
    assert [e["kind"] for e in model.view(1_400)["timeline"]] == ["marked", "unmarked"]


def test_the_new_owner_wins_while_the_old_owner_still_lists_the_task() -> None:
    model = GroupModel("app")
    model.apply(status("a", active=("0_0",), at=1_000))
    model.apply(status("b", active=(), learners={"0_0": 0}, at=1_000))
    model.apply(status("b", active=("0_0",), at=2_000))  # b's record came before a's
    view = model.view(2_100)
    assert task(view, "0_0")["active"] == "b-thread-0"
    model.apply(status("a", active=(), at=2_500))
    view = model.view(2_600)
    assert task(view, "0_0")["active"] == "b-thread-0"
    (move,) = kinds(view, "moved")
    assert move["cause"] == "learner caught up" and move["gap_ms"] is None


def test_a_task_of_a_silent_member_fails_over() -> None:
    model = GroupModel("app")
    model.apply(status("a", active=("0_0",), at=1_000))
    model.apply(status("b", active=("0_1",), at=1_000))
    assert not model.view(1_000 + STALE_AFTER_MS - 1)["instances"][0]["threads"][0]["stale"]
    later = 1_000 + STALE_AFTER_MS + 5_000
    model.apply(status("b", active=("0_1", "0_0"), at=later))
    view = model.view(later)
    assert view["instances"][0]["threads"][0]["stale"] is True
    (move,) = kinds(view, "moved")
    assert move["task"] == "0_0" and move["cause"] == "failover"


def test_rounds_are_grouped_by_generation_and_time() -> None:
    model = GroupModel("app")
    model.apply(status("a", rebalances=1, generation=1, at=0))
    model.apply(status("b", rebalances=1, generation=1, at=0))
    model.apply(status("a", rebalances=2, generation=2, at=10_000))
    model.apply(status("b", rebalances=2, generation=2, at=10_900))
    model.apply(status("a", rebalances=3, generation=3, at=30_000))
    model.apply(status("b", rebalances=3, generation=3, at=30_500))
    # A leader-only round on a broker that keeps the generation is a round of its own.
    model.apply(status("a", rebalances=4, generation=3, at=60_000))
    rounds = kinds(model.view(61_000), "rebalance")
    assert [(r["generation"], len(r["members"])) for r in rounds] == [(2, 2), (3, 2), (3, 1)]


def test_the_timeline_keeps_the_window() -> None:
    model = GroupModel("app", window_ms=60_000)
    model.apply(status("a", active=("0_0",), at=0))
    model.apply(status("b", active=("0_1",), at=100_000))
    view = model.view(120_000)
    assert [e["text"] for e in view["timeline"]] == [
        "b-thread-0 publishes (instance b)", "0_1: active on b-thread-0"]
    assert len(model.view(120_000, window_ms=200_000)["timeline"]) == 4
    # a has been silent since 0: its span ends at its last record, before the window.
    (lane,) = [lane for lane in view["lanes"] if lane["task"] == "0_0"]
    assert lane["spans"] == []
    (lane,) = [lane for lane in model.view(120_000, window_ms=200_000)["lanes"]
               if lane["task"] == "0_0"]
    assert lane["spans"] == [{"member": "a-thread-0", "instance": "a", "role": "active",
                              "start_ms": 0, "end_ms": 0, "open": False}]


def test_leaving_deadlines_from_marks_and_from_members() -> None:
    model = GroupModel("app")
    model.apply(status("a", at=0))
    model.apply(MarkRecord("a", LeavingMark(1_000, None), 1_000))  # the app's default timeout
    model.apply(status("b", leaving=True, at=2_000, leaving_deadline_ms=90_000))
    leaving = {i["instance"]: i for i in model.view(10_000)["leaving"]}
    assert leaving["a"]["deadline_ms"] is None and leaving["a"]["acknowledged"] is False
    assert leaving["a"]["state"] == "marked"
    assert leaving["b"]["source"] == "status" and leaving["b"]["deadline_ms"] == 90_000
    assert leaving["b"]["remaining_ms"] == 80_000 and leaving["b"]["acknowledged"] is True
    model.apply(StatusRecord("a-thread-0", None, 11_000))
    assert model.view(11_000)["leaving"][0]["state"] == "gone"


def test_restoring_progress_is_known_only_with_its_lag() -> None:
    model = GroupModel("app")
    model.apply(status("a", restoring=("0_0", "0_1"), restoring_lag={"0_1": 400}, at=0))
    model.apply(status("a", restoring=("0_0", "0_1"), restoring_lag={"0_1": 100}, at=1_000))
    view = model.view(1_000)
    assert task(view, "0_0")["restoring"] == {"member": "a-thread-0", "instance": "a",
                                              "lag": None, "progress": None,
                                              "done_in_ms": None}
    assert task(view, "0_1")["restoring"]["progress"] == 0.75
    assert task(view, "0_1")["restoring"]["done_in_ms"] == 333  # 100 left at 300/s
    assert task(view, "0_0")["isStateful"] is True


def test_a_learners_pace_and_when_it_will_be_ready() -> None:
    model = GroupModel("app")
    model.apply(status("a", learners={"0_0": 10_000}, at=0))
    model.apply(status("a", learners={"0_0": 8_000}, at=1_000))   # 2,000/s
    model.apply(status("a", learners={"0_0": 5_000}, at=2_000))   # 3,000/s: 2,500 smoothed
    (learner,) = task(model.view(2_000), "0_0")["learners"]
    assert learner["catch_up_per_s"] == 2_500.0
    assert learner["ready_in_ms"] == 1_960  # (5,000 - 100) / 2,500 per second
    model.apply(status("a", learners={"0_0": 9_000}, at=3_000))   # falling behind
    (learner,) = task(model.view(3_000), "0_0")["learners"]
    assert learner["catch_up_per_s"] < 0 and learner["ready_in_ms"] is None


def test_standby_copies_and_published_stateful_tasks() -> None:
    view = group_view("app", [
        status("a", active=("0_0", "1_0"), stateful_tasks=["0_0"], at=0),
        status("b", standbys={"0_0": 300}, at=0),
        status("b", standbys={"0_0": 30}, at=1_000),
    ], now_ms=1_000)
    (standby,) = task(view, "0_0")["standbys"]
    assert standby["role"] == "standby" and standby["isLearner"] is False
    assert standby["isReady"] is True and standby["progress"] == 0.9
    assert task(view, "0_0")["beingLearned"] is False
    assert task(view, "1_0")["isStateful"] is False  # the list is every stateful task


def test_a_task_its_owner_publishes_as_being_learned() -> None:
    # The learner's member has not published its copy yet; the owner already says so.
    view = group_view("app", [status("a", active=("0_0", "0_1"), being_learned=["0_1"], at=0)],
                      now_ms=0)
    assert task(view, "0_1")["beingLearned"] is True and task(view, "0_1")["learners"] == []
    assert task(view, "0_0")["beingLearned"] is False


def test_malformed_records_are_counted_and_the_last_good_status_kept() -> None:
    model = GroupModel("app")
    model.apply(status("a", active=("0_0",), at=0))
    bad = dict(status("a", at=1_000).value or {})
    bad["learners"] = {"0_0": "lots"}
    model.apply(StatusRecord("a-thread-0", bad, 1_000))
    model.apply(StatusRecord("a-thread-0", {"thread": 0}, 1_100))
    model.apply(StatusRecord("a-thread-0", ["not", "a", "map"], 1_200))  # type: ignore[arg-type]
    model.reject("undecodable status record of 'x' at offset 7")
    view = model.view(2_000)
    assert view["unreadable_records"] == 4
    assert view["last_error"] == "undecodable status record of 'x' at offset 7"
    assert task(view, "0_0")["active"] == "a-thread-0"


def test_parse_status_names_the_member_and_field() -> None:
    value = dict(status("a", at=0).value or {})
    del value["updated_ms"]
    try:
        parse_status("a-thread-0", value)
    except ValueError as exc:
        assert str(exc) == "status of 'a-thread-0' lacks 'updated_ms'"
    else:
        raise AssertionError("a status without updated_ms was accepted")
    value = dict(status("a", at=0).value or {}, thread=True)
    try:
        parse_status("a-thread-0", value)
    except ValueError as exc:
        assert str(exc) == "status of 'a-thread-0': 'thread' is True"
    else:
        raise AssertionError("a boolean thread index was accepted")


def test_a_killed_members_task_is_unassigned_from_its_last_record() -> None:
    """The gap of a failover runs from the dead member's last record (when it stopped), not
    from when the view found it silent."""
    model = GroupModel("app")
    model.apply(status("a", active=("0_0",), at=1_000))
    for at in range(1_000, 18_001, 1_000):
        model.apply(status("b", active=("0_1",), at=at))
    view = model.view(18_000)
    assert task(view, "0_0")["unassigned_since_ms"] == 1_000
    model.apply(status("b", active=("0_1", "0_0"), at=18_500))
    view = model.view(18_500)
    (move,) = kinds(view, "moved")
    assert move["cause"] == "failover" and move["gap_ms"] == 17_500
    [active_a] = [s for s in next(lane for lane in view["lanes"] if lane["task"] == "0_0")
                  ["spans"] if s["member"] == "a-thread-0"]
    assert active_a["end_ms"] == 1_000


def test_a_tasks_dropped_and_misrouted_records_come_from_its_active() -> None:
    model = GroupModel("app")
    model.apply(status("a", active=("0_0", "0_1"), at=1_000,
                       dropped={"0_0": {"late": 3, "deserialize": 1}}, misrouted={"0_1": 2}))
    view = model.view(1_000)
    assert task(view, "0_0")["dropped"] == {"late": 3, "deserialize": 1}
    assert task(view, "0_0")["misrouted"] == 0
    assert task(view, "0_1")["dropped"] == {} and task(view, "0_1")["misrouted"] == 2
    assert json.loads(json.dumps(view)) == view


def test_malformed_drop_counts_are_rejected_by_name() -> None:
    model = GroupModel("app")
    model.apply(status("a", active=("0_0",), at=1_000, dropped={"0_0": "many"}))
    assert model.unreadable == 1 and "'dropped'" in (model.last_error or "")


def test_a_stateless_task_restoring_a_moment_is_stateless_once_the_members_list_them() -> None:
    model = GroupModel("app")
    model.apply(status("a", active=("1_0",), restoring=("0_0",), at=0,
                       stateful_tasks=["1_0", "1_1"]))
    view = model.view(0)
    assert task(view, "0_0")["isStateful"] is False
    assert task(view, "0_0")["tags"] == []
    assert task(view, "1_0")["isStateful"] is True


def test_a_silent_member_is_no_leader_and_is_gone_after_the_window() -> None:
    model = GroupModel("app", window_ms=600_000)
    model.apply(status("crashed", active=("0_0",), leader=True, at=1_000))
    model.apply(status("alive", active=("0_1",), at=1_000))
    for at in range(2_000, 700_000, 10_000):
        model.apply(status("alive", active=("0_0", "0_1"), at=at, generation=2))

    def threads(view: dict[str, Any]) -> dict[str, bool]:
        return {t["member"]: t["leader"] for i in view["instances"] for t in i["threads"]}

    assert threads(model.view(1_000 + STALE_AFTER_MS - 1)) == {
        "crashed-thread-0": True, "alive-thread-0": False}
    stale = model.view(1_000 + STALE_AFTER_MS)
    assert threads(stale) == {"crashed-thread-0": False, "alive-thread-0": False}
    gone = model.view(1_000 + 600_001)
    assert threads(gone) == {"alive-thread-0": False}
    assert any("crashed" in e["text"] for e in model.view(1_000 + 600_001, 10**9)["timeline"])
