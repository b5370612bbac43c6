"""Which engine replica serves a request: the routing table (pure) and endpoint state (runtime)."""
