"""Internal: interactive queries: reading a store, routing a key to its owner, and the HTTP
server that answers them."""
