"""A database of one's own on a shared PostgreSQL server: created empty (or migrated), dropped
``WITH (FORCE)`` afterwards, so no test or benchmark sees another's tables or leaves any behind.

The server is found or started by :mod:`fleet_testing.servers`; `scratch_database` is the one way
the fixtures (``postgres_url``), the end-to-end system and the benchmarks make a database on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator

import psycopg
from psycopg import sql

from fleet_core.shared.storage.migrations import apply_migrations
from fleet_testing import servers

__all__ = ["PREFIX", "scratch_database"]

PREFIX = "fleet_t_"
"""Every scratch database's name starts so: one left behind by a killed run is recognisable."""


@contextlib.contextmanager
def scratch_database(server_url: str, *, migrated: bool = False) -> Iterator[str]:
    """The URL of a new database on the server at ``server_url`` (a superuser's URL), with every
    migration applied when ``migrated``; dropped when the block ends."""
    name = f"{PREFIX}{secrets.token_hex(6)}"
    _administer(server_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = servers.with_database(server_url, name)
        if migrated:
            asyncio.run(_migrate(url))
        yield url
    finally:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        _administer(server_url, drop)


def _administer(url: str, statement: sql.Composed) -> None:
    # CREATE/DROP DATABASE cannot run inside a transaction block.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


async def _migrate(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await apply_migrations(conn)
