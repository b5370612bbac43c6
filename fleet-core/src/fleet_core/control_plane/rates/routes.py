"""HTTP edge of unit rates: ``/api/v1/model-rates`` and ``/api/v1/model-rates/{model}``.

Model names hold slashes (``Qwen/Qwen2.5-7B-Instruct``), so the path parameter takes the rest of
the path; a client may also percent-encode them.
"""

from __future__ import annotations

import msgspec
from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fleet_core.control_plane.auth import guard
from fleet_core.control_plane.rates.store import RatesStore
from fleet_core.control_plane.rates.wire import ModelRates, RatesPut, stored_rates
from fleet_core.shared import web
from fleet_core.shared.errors import InvalidRequest, NotFound

__all__ = ["rates_routes"]

_PUT = msgspec.json.Decoder(RatesPut)
MODEL_MAX = 256


def _model(request: Request) -> str:
    model: str = request.path_params["model"]
    if not model or len(model) > MODEL_MAX or "\x00" in model:
        raise InvalidRequest(
            f"the model name must be 1 to {MODEL_MAX} characters without NUL", param="model"
        )
    return model


def _found(rates: ModelRates | None, model: str) -> ModelRates:
    if rates is None:
        raise NotFound(f"no rates for model {model!r}")
    return rates


class _Rates:
    def __init__(self, store: RatesStore) -> None:
        self.store = store

    async def list(self, request: Request) -> Response:
        return web.json_response({"object": "list", "data": await self.store.list()})

    async def get(self, request: Request) -> Response:
        model = _model(request)
        return web.json_response(_found(await self.store.get(model), model))

    async def put(self, request: Request) -> Response:
        model = _model(request)
        put = web.decode(_PUT, await request.body())
        rates, old = await self.store.replace(model, stored_rates(put))
        guard.audit_detail(request, {"before": old, "after": rates})
        return web.json_response(rates, 201 if old is None else 200)

    async def delete(self, request: Request) -> Response:
        model = _model(request)
        return web.json_response(_found(await self.store.delete(model), model))


def rates_routes(pool: AsyncConnectionPool) -> list[BaseRoute]:
    rates = _Rates(RatesStore(pool))
    one = "/api/v1/model-rates/{model:path}"
    return [
        Route("/api/v1/model-rates", rates.list, methods=["GET"]),
        Route(one, rates.get, methods=["GET"]),
        Route(one, rates.put, methods=["PUT"]),
        Route(one, rates.delete, methods=["DELETE"]),
    ]
