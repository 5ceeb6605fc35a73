"""Internal: Relay's rebalance protocol as a group member sees it: the partition assignor's
glue, the rebalance listener, subscriptions and assignments, the control and status topics,
learner readiness, promotion asks and warm-up."""
