"""``model_rates`` rows (migration 0004); the gateway reads the same table for its catalog."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.rates.wire import ModelRates
from fleet_core.shared import pricing

__all__ = ["RatesStore"]

_UPSERT = (
    "INSERT INTO model_rates"
    " (model, input_fresh_micro_per_1k, input_cached_micro_per_1k, output_micro_per_1k)"
    " VALUES (%s, %s, %s, %s) ON CONFLICT (model) DO UPDATE SET"
    " input_fresh_micro_per_1k = excluded.input_fresh_micro_per_1k,"
    " input_cached_micro_per_1k = excluded.input_cached_micro_per_1k,"
    " output_micro_per_1k = excluded.output_micro_per_1k, updated_at = now()"
)


_COLUMNS = (
    "model, input_fresh_micro_per_1k, input_cached_micro_per_1k, output_micro_per_1k, updated_at"
)


def _rates(row: dict[str, Any] | None) -> ModelRates | None:
    if row is None:
        return None
    return ModelRates(
        model=row["model"],
        input_fresh=pricing.to_wire(row["input_fresh_micro_per_1k"]),
        input_cached=pricing.to_wire(row["input_cached_micro_per_1k"]),
        output=pricing.to_wire(row["output_micro_per_1k"]),
        updated_at=row["updated_at"],
    )


class RatesStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    async def list(self) -> list[ModelRates]:
        async with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(f"SELECT {_COLUMNS} FROM model_rates ORDER BY model")
            return [r for row in await cur.fetchall() if (r := _rates(row)) is not None]

    async def get(self, model: str) -> ModelRates | None:
        async with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(f"SELECT {_COLUMNS} FROM model_rates WHERE model = %s", (model,))
            return _rates(await cur.fetchone())

    async def replace(
        self, model: str, rates: pricing.Rates
    ) -> tuple[ModelRates, ModelRates | None]:
        """Upsert, in one transaction with reading what it replaced: ``(new, old)``, ``old``
        None when the model had no rates (the audit trail records both)."""
        async with self._pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                f"SELECT {_COLUMNS} FROM model_rates WHERE model = %s FOR UPDATE", (model,)
            )
            old = _rates(await cur.fetchone())
            await cur.execute(
                _UPSERT + f" RETURNING {_COLUMNS}",
                (model, rates.input_fresh, rates.input_cached, rates.output),
            )
            new = _rates(await cur.fetchone())
        assert new is not None
        return new, old

    async def delete(self, model: str) -> ModelRates | None:
        async with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                f"DELETE FROM model_rates WHERE model = %s RETURNING {_COLUMNS}", (model,)
            )
            return _rates(await cur.fetchone())
