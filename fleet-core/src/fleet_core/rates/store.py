"""``model_rates`` rows (migration 0004); the gateway reads the same table for its catalog."""

from __future__ import annotations

from typing import Any

from psycopg.rows import class_row, dict_row
from psycopg_pool import AsyncConnectionPool

from fleet_core.rates.wire import ModelRates, RatesPut

__all__ = ["RatesStore"]

_COLUMNS = "model, input_fresh, input_cached, output, updated_at"


def _rates(**row: Any) -> ModelRates:
    return ModelRates(**row)


class RatesStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    async def list(self) -> list[ModelRates]:
        async with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(ModelRates))
            await cur.execute(f"SELECT {_COLUMNS} FROM model_rates ORDER BY model")
            return await cur.fetchall()

    async def get(self, model: str) -> ModelRates | None:
        async with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(ModelRates))
            await cur.execute(f"SELECT {_COLUMNS} FROM model_rates WHERE model = %s", (model,))
            return await cur.fetchone()

    async def put(self, model: str, rates: RatesPut) -> tuple[ModelRates, bool]:
        """Upsert; returns the row and whether it was created."""
        async with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "INSERT INTO model_rates (model, input_fresh, input_cached, output)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (model) DO UPDATE SET"
                " input_fresh = excluded.input_fresh, input_cached = excluded.input_cached,"
                " output = excluded.output, updated_at = now()"
                f" RETURNING {_COLUMNS}, (xmax = 0) AS created",
                (model, rates.input_fresh, rates.input_cached, rates.output),
            )
            row = await cur.fetchone()
        assert row is not None
        created = bool(row.pop("created"))
        return _rates(**row), created

    async def delete(self, model: str) -> ModelRates | None:
        async with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(ModelRates))
            await cur.execute(
                f"DELETE FROM model_rates WHERE model = %s RETURNING {_COLUMNS}", (model,)
            )
            return await cur.fetchone()
