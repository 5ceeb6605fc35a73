"""The brokers Relay can start on loopback, by engine name: ``tansu`` (the embedded default,
:mod:`streams.testing.broker`) and ``kafka`` (Apache Kafka, :mod:`streams.testing.apache_kafka`).
"""

from __future__ import annotations

from typing import Literal, Protocol, Self, get_args

from streams.testing.apache_kafka import KafkaCluster
from streams.testing.broker import EmbeddedBroker

Engine = Literal["tansu", "kafka"]
ENGINES: tuple[Engine, ...] = get_args(Engine)


class LoopbackBroker(Protocol):
    """What both launchers offer."""

    name: str

    @property
    def bootstrap_servers(self) -> str: ...

    @property
    def running(self) -> bool: ...

    def start(self) -> Self: ...

    def stop(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


def broker_for(engine: str, port: int | None = None, host: str = "127.0.0.1",
               for_tests: bool = False) -> LoopbackBroker:
    """A broker of ``engine``, not yet started. ``for_tests`` gives Apache Kafka its tests'
    settings (no initial rebalance delay); Tansu has none to give."""
    if engine == "tansu":
        return EmbeddedBroker(port=port, host=host)
    if engine == "kafka":
        return KafkaCluster(port=port, host=host, for_tests=for_tests)
    raise ValueError(f"unknown broker engine {engine!r}: use one of {', '.join(ENGINES)}")
