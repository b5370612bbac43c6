"""fleet-apiserver: the control plane's HTTP API (/api/v1)."""
