"""Fleet's shared real-service test harness, loaded by the root conftest as pytest plugins.

`servers` finds or starts real PostgreSQL and Redis servers (no fakes, STYLE §6); `fix_postgres`,
`fix_redis` and `fix_proxy` turn them into fixtures: a database and a Redis key prefix per test,
and a TCP proxy that can cut connections to simulate outages.
"""
