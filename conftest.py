"""Load the shared real-service harness (e2e/fleet_testing) as plugins for every package's tests."""

pytest_plugins = [
    "fleet_testing.fix_auth",
    "fleet_testing.fix_postgres",
    "fleet_testing.fix_redis",
    "fleet_testing.fix_proxy",
    "fleet_testing.fix_redis_process",
    "fleet_testing.fix_s3",
    "fleet_testing.fix_fault_engine",
    "fleet_testing.fix_kube",
]
