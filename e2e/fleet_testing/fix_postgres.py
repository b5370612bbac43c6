"""pytest fixtures giving each test its own database on a real PostgreSQL server.

The server is found once per session (`servers.postgres`: environment variable, running server,
embedded wheel, container). Each test then gets a fresh ``fleet_t_<hex>`` database, dropped with
``WITH (FORCE)`` afterwards, so tests never see each other's tables or leave any behind.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleet_testing import databases, servers, sessions

__all__ = ["postgres_server", "postgres_url"]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[servers.Server]:
    """The session's PostgreSQL server: superuser URL and how it was found."""
    yield from sessions.session_server(servers.postgres)


@pytest.fixture
def postgres_url(postgres_server: servers.Server) -> Iterator[str]:
    """URL of a new, empty database for this test alone."""
    with databases.scratch_database(postgres_server.url) as url:
        yield url
