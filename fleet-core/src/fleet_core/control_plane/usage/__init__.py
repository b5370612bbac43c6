"""Usage read back from the ledger's per-minute rollups, for people and for finance."""
