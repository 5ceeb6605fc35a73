"""Public: what tests of a Relay app use: the topology test driver, and the embedded broker
for tests that need a real one."""

from streams.testing import TopologyTestDriver

__all__ = ["TopologyTestDriver"]
