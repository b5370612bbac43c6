"""pytest fixtures giving each test its own database on a real PostgreSQL server.

The server is found once per session (`servers.postgres`: environment variable, running server,
embedded wheel, container). Each test then gets a fresh ``fleet_t_<hex>`` database, dropped with
``WITH (FORCE)`` afterwards, so tests never see each other's tables or leave any behind.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from fleet_testing import servers, sessions

__all__ = ["postgres_server", "postgres_url"]

DATABASE_PREFIX = "fleet_t_"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[servers.Server]:
    """The session's PostgreSQL server: superuser URL and how it was found."""
    yield from sessions.session_server(servers.postgres)


@pytest.fixture
def postgres_url(postgres_server: servers.Server) -> Iterator[str]:
    """URL of a new, empty database for this test alone."""
    name = f"{DATABASE_PREFIX}{secrets.token_hex(6)}"
    _administer(postgres_server.url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield servers.with_database(postgres_server.url, name)
    finally:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        _administer(postgres_server.url, drop)


def _administer(url: str, statement: sql.Composed) -> None:
    # CREATE/DROP DATABASE cannot run inside a transaction block.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)
