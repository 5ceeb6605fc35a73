"""Peer systems measured beside Relay, built on first use (Kafka Streams in Java, by Maven)."""
