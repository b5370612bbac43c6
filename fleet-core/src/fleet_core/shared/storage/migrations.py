"""Forward-only schema migrations: versioned SQL files applied at start, once each.

Files are ``migrations/NNNN_name.sql``, applied in version order. All pending ones run inside one
transaction holding a transaction-scoped advisory lock, so two replicas starting together apply
them once (the second waits, then finds nothing to do), and a failing file leaves the schema as it
was. Applied versions are recorded in ``fleet_schema_migrations``; a recorded version whose file
is gone, or a database newer than the code, refuses to start rather than guessing.
"""

from __future__ import annotations

import importlib.resources
import re
from dataclasses import dataclass

import psycopg

from fleet_core.shared.errors import ConfigError

__all__ = ["Migration", "apply_migrations", "available"]

LOCK_KEY = 0x466C656574  # "Fleet": an arbitrary constant shared by every replica
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    """Every migration shipped in the package, in version order."""
    found = []
    for entry in (
        importlib.resources.files("fleet_core.shared.storage").joinpath("migrations").iterdir()
    ):
        if match := _FILE.match(entry.name):
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8")))
    return sorted(found, key=lambda m: m.version)


async def apply_migrations(conn: psycopg.AsyncConnection[object]) -> list[int]:
    """Apply what is pending; returns the versions applied now (empty when up to date)."""
    migrations = available()
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS fleet_schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cursor = await conn.execute("SELECT version FROM fleet_schema_migrations")
        done = {row[0] for row in await cursor.fetchall()}  # type: ignore[index]
        _check_known(done, migrations)
        applied = []
        for migration in migrations:
            if migration.version in done:
                continue
            await conn.execute(migration.sql.encode())
            await conn.execute(
                "INSERT INTO fleet_schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied.append(migration.version)
        return applied


def _check_known(done: set[int], migrations: list[Migration]) -> None:
    known = {m.version for m in migrations}
    unknown = sorted(done - known)
    if unknown:
        raise ConfigError(
            f"the database has schema version(s) {unknown} this fleet-core does not know: "
            "it is older than the database; run a newer fleet-core"
        )
