"""Internal: one stream thread's runtime: the loop, its tasks and their transitions, the state
updater, the record collector, delivery, commits and transactions, and the factory that
builds them."""
