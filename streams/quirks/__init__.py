"""Internal: workarounds for brokers that depart from Apache Kafka's group protocol, each in
a module of its own, switched on only for a broker that needs them."""
