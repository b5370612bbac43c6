"""Registry rows (0006 ``registry_models``), with the unit rates joined from ``model_rates`` (0004).

The rates have one home, ``model_rates``, keyed by the model id: the registry reads and upserts
them there, and the gateway's admission reads the same rows.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.registry.wire import (
    ModelFacts,
    ModelStatus,
    Rates,
    Source,
    WeightFormat,
)
from fleet_core.shared import paging, pricing
from fleet_core.shared.storage.rows import utc_row

__all__ = ["ModelRecord", "ModelStore", "PlannedFile"]


class PlannedFile(msgspec.Struct, frozen=True, kw_only=True):
    """One file of a pull: what the hub promised, and whether it is stored and verified."""

    path: str
    size: int
    sha256: str | None = None
    blob_id: str | None = None
    done: bool = False
    stored_sha256: str | None = None


class ModelRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    source: Source
    format: WeightFormat | None
    status: ModelStatus
    reason: str
    revision: str | None
    files: tuple[PlannedFile, ...]
    bytes_done: int
    facts: ModelFacts | None
    rates: Rates | None
    created_at: datetime
    updated_at: datetime


_COLUMNS = (
    "m.id, m.source, m.format, m.status, m.reason, m.revision, m.files, m.bytes_done, m.facts,"
    " m.created_at, m.updated_at, r.input_fresh_micro_per_1k AS input_fresh,"
    " r.input_cached_micro_per_1k AS input_cached, r.output_micro_per_1k AS output"
)
_SELECT = f"SELECT {_COLUMNS} FROM registry_models m LEFT JOIN model_rates r ON r.model = m.id"


def _record(
    *,
    source: Any,
    files: Any,
    facts: Any,
    input_fresh: int | None,
    input_cached: int | None,
    output: int | None,
    **columns: Any,
) -> ModelRecord:
    rates = None
    if input_fresh is not None and input_cached is not None and output is not None:
        rates = Rates(
            input_fresh=pricing.to_wire(input_fresh),
            input_cached=pricing.to_wire(input_cached),
            output=pricing.to_wire(output),
        )
    return ModelRecord(
        source=msgspec.convert(source, Source),
        files=msgspec.convert(files, tuple[PlannedFile, ...]),
        facts=msgspec.convert(facts, ModelFacts) if facts is not None else None,
        rates=rates,
        **columns,
    )


def _json(value: object) -> str:
    return msgspec.json.encode(value).decode()


class ModelStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    async def insert(
        self, model_id: str, source: Source, fmt: WeightFormat | None
    ) -> ModelRecord | None:
        """The new row, or None when the id is taken."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "INSERT INTO registry_models (id, source, format) VALUES (%s, %s::jsonb, %s)"
                " ON CONFLICT (id) DO NOTHING RETURNING id",
                (model_id, _json(source), fmt),
            )
            inserted = await cursor.fetchone()
        return await self.get(model_id) if inserted else None

    async def all(self) -> list[ModelRecord]:
        return await self._many(f"{_SELECT} ORDER BY m.created_at, m.id", ())

    async def page(self, page: paging.Page) -> list[ModelRecord]:
        past, order = paging.keyset(["m.created_at", "m.id"], page)
        return await self._many(f"{_SELECT} WHERE {past} ORDER BY {order}", paging.params(page))

    async def pulling(self) -> list[ModelRecord]:
        return await self._many(f"{_SELECT} WHERE m.status = 'Pulling' ORDER BY m.id", ())

    async def get(self, model_id: str) -> ModelRecord | None:
        found = await self._many(f"{_SELECT} WHERE m.id = %s", (model_id,))
        return found[0] if found else None

    async def delete(self, model_id: str) -> bool:
        async with self._pool.connection() as conn:
            cursor = await conn.execute("DELETE FROM registry_models WHERE id = %s", (model_id,))
            return cursor.rowcount > 0

    async def claim_pull(self, model_id: str) -> bool:
        """Registered, Failed or Cancelled → Pulling, atomically: one pull per model."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "UPDATE registry_models SET status = 'Pulling', reason = '', revision = NULL,"
                " files = '[]', bytes_done = 0, facts = NULL, updated_at = now()"
                " WHERE id = %s AND status IN ('Registered', 'Failed', 'Cancelled')",
                (model_id,),
            )
            return cursor.rowcount > 0

    async def save_progress(
        self,
        model_id: str,
        *,
        revision: str | None,
        files: tuple[PlannedFile, ...],
        bytes_done: int,
    ) -> None:
        await self._update(
            "revision = %s, files = %s::jsonb, bytes_done = %s",
            (revision, _json(files), bytes_done),
            model_id,
        )

    async def finish(
        self, model_id: str, status: ModelStatus, *, reason: str, facts: ModelFacts | None
    ) -> None:
        await self._update(
            "status = %s, reason = %s, facts = %s::jsonb",
            (status, reason, _json(facts) if facts is not None else None),
            model_id,
        )

    async def upsert_rates(self, model_id: str, rates: pricing.Rates) -> None:
        """The model's rates in ``model_rates`` (integer micro-units per 1,000 tokens)."""
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO model_rates (model, input_fresh_micro_per_1k,"
                " input_cached_micro_per_1k, output_micro_per_1k) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (model) DO UPDATE SET"
                " input_fresh_micro_per_1k = excluded.input_fresh_micro_per_1k,"
                " input_cached_micro_per_1k = excluded.input_cached_micro_per_1k,"
                " output_micro_per_1k = excluded.output_micro_per_1k, updated_at = now()",
                (model_id, rates.input_fresh, rates.input_cached, rates.output),
            )

    async def _update(self, assignments: str, params: tuple[object, ...], model_id: str) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                f"UPDATE registry_models SET {assignments}, updated_at = now()"
                " WHERE id = %s AND status = 'Pulling'",
                (*params, model_id),
            )

    async def _many(
        self, query: str, params: tuple[object, ...] | dict[str, Any]
    ) -> list[ModelRecord]:
        async with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=utc_row(_record))
            await cursor.execute(query.encode(), params)
            return await cursor.fetchall()
