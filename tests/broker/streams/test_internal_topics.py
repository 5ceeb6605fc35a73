"""The internal topics an app creates on a real broker, with their configuration: a
repartition topic keeps its records however old their timestamps (a broker's time retention
would delete them unread when an app processes older data)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from tests.broker.streams.harness import counting_app, counting_topics
from tests.conftest import on_tansu

pytestmark = pytest.mark.broker


async def test_a_repartition_topic_has_no_time_retention(
    tmp_path: Path, bootstrap: str, unique: Callable[[str], str],
) -> None:
    if on_tansu(bootstrap):
        pytest.skip("the embedded broker neither retains by time nor describes topic configs")
    app_id = unique("retention")
    source, sink, _traffic = await counting_topics(bootstrap, app_id)
    app = counting_app(app_id, bootstrap, tmp_path, source, sink, stages=2)
    (repartition,) = app.topology.repartition_topics
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await app.prepare(admin)
        (described,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, repartition)])
    finally:
        await admin.close()
    ((_code, _message, _type, _name, entries),) = described.resources
    configs = {entry[0]: entry[1] for entry in entries}
    assert configs["retention.ms"] == "-1"
    assert configs["cleanup.policy"] == "delete"
