"""Internal: the Kafka client driver: the only place that touches aiokafka's internals (the
cooperative coordinator, static membership requests, read-committed fetching)."""
