"""A group-level error in an OffsetFetch answer (``streams.kafka.offset_fetch``): Apache Kafka
answers a coordinator that is still loading the group's offsets, or that moved, with the error
in the answer's own field and no partition; read as "no committed offset", a task would start
from the beginning of its input (no broker: answers built from aiokafka's schemas)."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka import errors as kafka_errors
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.protocol.commit import OffsetFetchResponse_v1, OffsetFetchResponse_v3
from aiokafka.structs import TopicPartition

from streams.kafka.cooperative import CooperativeGroupCoordinator
from streams.kafka.offset_fetch import group_error, raise_group_error

TP = TopicPartition("orders", 4)


def answer(error_code: int, offset: int | None = None) -> Any:
    partitions = [] if offset is None else [(TP.topic, [(TP.partition, offset, "", 0)])]
    return OffsetFetchResponse_v3(0, partitions, error_code)


class Coordinator(CooperativeGroupCoordinator):
    """Only what ``_do_fetch_commit_offsets`` and ``_send_req`` touch."""

    def __init__(self) -> None:  # no client, no background tasks
        self.group_id = "app"
        self.deaths = 0

    def coordinator_dead(self) -> None:
        self.deaths += 1


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    queue: list[Any] = []

    async def send(self: Any, request: Any) -> Any:
        return queue.pop(0)

    monkeypatch.setattr(GroupCoordinator, "_send_req", send)
    return queue


@pytest.mark.asyncio
async def test_a_loading_coordinator_is_an_error_to_retry_not_an_empty_answer(
        answers: list[Any]) -> None:
    answers.append(answer(kafka_errors.GroupLoadInProgressError.errno))
    coordinator = Coordinator()
    with pytest.raises(kafka_errors.GroupLoadInProgressError) as raised:
        await coordinator._do_fetch_commit_offsets([TP])
    assert raised.value.retriable
    assert coordinator.deaths == 0


@pytest.mark.asyncio
async def test_a_moved_coordinator_is_looked_up_again(answers: list[Any]) -> None:
    answers.append(answer(kafka_errors.NotCoordinatorForGroupError.errno))
    coordinator = Coordinator()
    with pytest.raises(kafka_errors.NotCoordinatorForGroupError):
        await coordinator._do_fetch_commit_offsets([TP])
    assert coordinator.deaths == 1


@pytest.mark.asyncio
async def test_an_answer_without_group_error_gives_the_committed_offsets(
        answers: list[Any]) -> None:
    answers.append(answer(0, offset=2022))
    offsets = await Coordinator()._do_fetch_commit_offsets([TP])
    assert {tp: meta.offset for tp, meta in offsets.items()} == {TP: 2022}


def test_versions_without_the_field_have_no_group_error() -> None:
    assert group_error(OffsetFetchResponse_v1([(TP.topic, [(TP.partition, 7, "", 0)])])) is None


def test_a_group_level_refusal_that_retrying_cannot_cure_is_raised_as_it_is() -> None:
    deaths: list[None] = []
    with pytest.raises(kafka_errors.GroupAuthorizationFailedError) as raised:
        raise_group_error(answer(kafka_errors.GroupAuthorizationFailedError.errno),
                          lambda: deaths.append(None))
    assert not raised.value.retriable
    assert deaths == []
