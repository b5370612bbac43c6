"""The cost pool (P8): what the fleet cost in a month, split across the tenants that used it.

A self-hosted fleet costs the same busy or idle, so a month's bill is a fixed pool (observed
GPU-hours × each cluster's rate) apportioned by each tenant's share of busy GPU-time, idle
included. ``allocation`` holds the arithmetic as pure functions, ``measuring`` the definitions of
observed and busy time (in Python, the reference the SQL in ``store`` is tested against).
"""
