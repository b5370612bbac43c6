"""Budget rules: how much of a dimension a tenant or project may use per rolling window."""
