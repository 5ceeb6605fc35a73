"""Reading a one-partition topic (the status and control topics) from its beginning to its
end as it is now, for tools and for members that want its current picture once."""

from __future__ import annotations

from typing import Any

from aiokafka.structs import TopicPartition

from streams.kafka.started_consumer import started_consumer


async def read_to_end(bootstrap: str, topic: str) -> list[Any] | None:
    """Every record of ``topic``'s partition 0, oldest first, up to its end when asked; None
    while the topic does not exist (reading it then would have some brokers create it with
    their default settings)."""
    consumer = await started_consumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        if topic not in await consumer.topics():
            return None
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp])).get(tp, 0)
        records: list[Any] = []
        while await consumer.position(tp) < end:
            for batch in (await consumer.getmany(tp, timeout_ms=500)).values():
                records.extend(r for r in batch if r.offset < end)
        return records
    finally:
        await consumer.stop()
