"""The OpenAI-compatible gateway: one endpoint in front of many engine replicas (P1, P3, P6)."""
