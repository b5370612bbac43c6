"""The harness fixtures the cross-package tests use (see :mod:`fleet_testing.plugins`)."""

from __future__ import annotations

import pytest

from fleet_testing import plugins


def pytest_configure(config: pytest.Config) -> None:
    plugins.load(
        config, "fix_auth", "fix_postgres", "fix_redis", "fix_proxy", "fix_kube", "fix_node"
    )
