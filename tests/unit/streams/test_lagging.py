"""Which partitions lag, as the timestamp synchronization of a task's inputs reads it from
the consumer's own state (aiokafka's subscription, not started: no broker)."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from streams.kafka.driver import GroupConsumer

pytestmark = pytest.mark.asyncio

TABLE = TopicPartition("users", 2)
STREAM = TopicPartition("orders-repartition", 2)


async def test_a_partition_still_looking_up_its_position_lags() -> None:
    """A task with nothing committed asks for its partitions' earliest offsets without
    waiting. Until its table partition's lookup is answered, it lags: its stream partition,
    looked up first, must not run ahead of the table's rows (a soak on three brokers lost
    100 join outputs at its start that way)."""
    raw = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
    try:
        raw.assign([TABLE, STREAM])
        consumer = GroupConsumer(raw)
        states = raw._subscription.subscription.assignment
        states.state_value(STREAM).seek(0)
        assert consumer.lagging(TABLE)  # its position is still being looked up
        states.state_value(TABLE).seek(0)
        assert consumer.lagging(TABLE)  # no fetch has told its end yet
        states.state_value(TABLE).highwater = 40
        assert consumer.lagging(TABLE)
        states.state_value(TABLE).consumed_to(40)
        assert not consumer.lagging(TABLE)  # read to its end
        raw.pause(STREAM)
        assert not consumer.lagging(STREAM)  # paused: held back on purpose
        assert not consumer.lagging(TopicPartition("users", 9))  # not assigned
    finally:
        await raw.stop()
