"""Relay streams: the App, its DSL, stream threads, tasks and the cooperative rebalance layer."""
