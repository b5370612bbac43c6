"""The psycopg connection pool, opened and checked at start (psycopg's pool docs: open, then wait).

A database that cannot be reached at start is a refusal with one line naming FLEET_DATABASE_URL;
once running, a lost connection is psycopg_pool's to heal, and callers see ``DatabaseUnavailable``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import psycopg
from psycopg_pool import AsyncConnectionPool

from fleet_core.shared.errors import ConfigError, Unavailable
from fleet_core.shared.storage.migrations import apply_migrations

__all__ = ["DatabaseUnavailable", "open_pool"]

log = logging.getLogger("fleet.storage")


class DatabaseUnavailable(Unavailable):
    default_code = "database_unavailable"


async def _check_reachable(url: str) -> None:
    """One direct connection first: a clear refusal now beats a pool retrying in the background."""
    try:
        conn = await psycopg.AsyncConnection.connect(url, connect_timeout=5)
    except psycopg.Error as exc:
        lines = str(exc).strip().splitlines()
        reason = lines[-1].strip() if lines else type(exc).__name__
        raise ConfigError(
            "cannot connect to the database in FLEET_DATABASE_URL (is it running, and the URL "
            f"right?): {reason}"
        ) from exc
    await conn.close()


@contextlib.asynccontextmanager
async def open_pool(url: str, *, max_size: int = 10) -> AsyncIterator[AsyncConnectionPool]:
    """A started pool on ``url`` with migrations applied; ConfigError when it cannot start."""
    await _check_reachable(url)
    pool = AsyncConnectionPool(
        url, min_size=1, max_size=max_size, open=False, timeout=5, kwargs={"autocommit": True}
    )
    await pool.open(wait=True, timeout=10)
    try:
        async with pool.connection() as conn:
            applied = await apply_migrations(conn)
        if applied:
            log.info("applied schema migrations %s", applied)
        yield pool
    finally:
        await pool.close()
