"""Schema migrations: applied once, recorded, safe when two replicas start together."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from fleet_core.shared.errors import ConfigError
from fleet_core.shared.storage.migrations import apply_migrations, available

from .conftest import refused_to_start


async def test_two_replicas_starting_together_apply_each_migration_once(postgres_url: str) -> None:
    async def start() -> list[int]:
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
            return await apply_migrations(conn)

    first, second = await asyncio.gather(start(), start())
    versions = [m.version for m in available()]
    assert sorted(first + second) == versions  # one of them did it all, the other nothing
    with psycopg.connect(postgres_url) as conn:
        recorded = [
            r[0]
            for r in conn.execute("SELECT version FROM fleet_schema_migrations ORDER BY version")
        ]
    assert recorded == versions
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        assert await apply_migrations(conn) == []


async def test_a_database_newer_than_the_code_refuses_to_start(postgres_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await apply_migrations(conn)
        await conn.execute("INSERT INTO fleet_schema_migrations (version, name) VALUES (9999, 'x')")
        with pytest.raises(ConfigError, match=r"\[9999\]"):
            await apply_migrations(conn)


def test_the_cli_refuses_an_unreachable_database_in_one_line() -> None:
    stderr = refused_to_start({"FLEET_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})
    assert stderr.startswith("fleet-apiserver: cannot connect to the database")


async def test_float_rates_become_integer_micro_units_per_1k_tokens(postgres_url: str) -> None:
    """Migration 0011 keeps every existing rate, to the thousandth of a unit per million tokens."""
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        for migration in available():
            if migration.version >= 11:
                break
            await conn.execute(migration.sql.encode())
        await conn.execute(
            "INSERT INTO model_rates (model, input_fresh, input_cached, output)"
            " VALUES ('m', 0.5, 123456.789, 0.0015)"
        )
        (integer_rates,) = [m for m in available() if m.version == 11]
        await conn.execute(integer_rates.sql.encode())
        cur = await conn.execute(
            "SELECT input_fresh_micro_per_1k, input_cached_micro_per_1k, output_micro_per_1k"
            " FROM model_rates"
        )
        assert await cur.fetchall() == [(500, 123456789, 2)]
