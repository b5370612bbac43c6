"""How a package's tests load the harness fixtures they use, and only those.

Each package's ``tests/conftest.py`` names the fixture plugins (``fix_*`` modules here) its tests
use and loads them in its ``pytest_configure`` with `load`::

    def pytest_configure(config: pytest.Config) -> None:
        plugins.load(config, "fix_auth", "fix_postgres")

so ``pytest contract/tests`` starts no server and loads no plugin, and ``pytest fleet-core/tests``
loads only what fleet-core's tests use. pytest refuses ``pytest_plugins`` outside the root
conftest because a plugin, once registered, serves every directory; the same holds for a plugin
registered here, and it is wanted: when several packages run in one session they share one
registration of each plugin, hence one session-scoped PostgreSQL, Redis, SeaweedFS and Kubernetes
control plane. (Importing the fixture functions into each conftest would scope them to their
directory but start each session server once per package that imports it.) A plugin one package
loads is visible to the others in the same run: a package that forgets to declare one passes
together with the others and fails alone, which ``pytest <package>/tests`` shows.
"""

from __future__ import annotations

import pytest

__all__ = ["PLUGINS", "load"]

PLUGINS = (
    "fix_auth",
    "fix_fault_engine",
    "fix_kube",
    "fix_node",
    "fix_postgres",
    "fix_proxy",
    "fix_redis",
    "fix_redis_process",
    "fix_s3",
)
"""Every fixture plugin of the harness."""

# A package's conftest imports this module first; a sub-folder's conftest may then import a
# plugin module for a helper (``fix_auth.bearer``) before `load` registers it, and pytest rewrites
# the assertions of a module only if told before its import.
pytest.register_assert_rewrite(*(f"fleet_testing.{name}" for name in PLUGINS))


def load(config: pytest.Config, *names: str) -> None:
    """Register ``fleet_testing.<name>`` for each name (once, however many packages ask)."""
    for name in names:
        assert name in PLUGINS, f"{name} is not a plugin of fleet_testing"
        config.pluginmanager.import_plugin(f"fleet_testing.{name}")
