"""HTTP edge of the model registry: models, their pulls (with an event stream) and imports
(streamed uploads), tokenizers and the files of Ready models (what the operator's init container
downloads)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from fleet_contract import encode_weights
from fleet_core.control_plane.registry.importing import UploadInterrupted
from fleet_core.control_plane.registry.service import RegistryService
from fleet_core.control_plane.registry.wire import ImportPlan, ModelCreate, ModelPatch, PullProgress
from fleet_core.shared import paging, web
from fleet_core.shared.errors import RangeNotSatisfiable

__all__ = ["registry_routes"]

_CREATE = msgspec.json.Decoder(ModelCreate)
_PATCH = msgspec.json.Decoder(ModelPatch)
_PLAN = msgspec.json.Decoder(ImportPlan)
_OCTETS = "application/octet-stream"
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class _Models:
    def __init__(self, service: RegistryService) -> None:
        self.service = service

    async def create(self, request: Request) -> Response:
        new = web.decode(_CREATE, await request.body())
        return web.json_response(await self.service.register(new), 201)

    async def list(self, request: Request) -> Response:
        page = paging.page(request.query_params, ["time", "text"])
        return web.json_response(await self.service.list_models(page))

    async def get(self, request: Request) -> Response:
        return web.json_response(await self.service.get(request.path_params["model_id"]))

    async def patch(self, request: Request) -> Response:
        patch = web.decode(_PATCH, await request.body())
        return web.json_response(await self.service.patch(request.path_params["model_id"], patch))

    async def delete(self, request: Request) -> Response:
        return web.json_response(await self.service.delete(request.path_params["model_id"]))

    async def tokenizer(self, request: Request) -> Response:
        body = await self.service.tokenizer(request.path_params["model_id"])
        return StreamingResponse(body, media_type="application/json")

    async def file(self, request: Request) -> Response:
        """The file, or one byte range of it (``Range: bytes=N-`` is how ``curl -C -`` resumes
        an interrupted download); ``If-Range`` with another ETag gets the whole file."""
        params = request.path_params
        stored = await self.service.file(params["model_id"], params["name"])
        size, etag = stored.file.size, f'"{stored.file.sha256}"'
        headers = {"ETag": etag, "X-Fleet-Sha256": stored.file.sha256, "Accept-Ranges": "bytes"}
        direct = stored.direct_url() if request.method == "GET" else None
        if direct is not None:  # the store serves it (Range included); we only sign the URL
            return Response(status_code=307, headers={**headers, "Location": direct})
        wanted = None
        if request.headers.get("if-range", etag) == etag:
            wanted = byte_range(request.headers.get("range"), size)
        start, end, status = (0, size - 1, 200) if wanted is None else (*wanted, 206)
        headers["Content-Length"] = str(end - start + 1)
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        if request.method == "HEAD":  # the headers alone: nothing is read from the store
            return Response(status_code=status, headers=headers, media_type=_OCTETS)
        body = stored.body(start, end)
        return StreamingResponse(body, status_code=status, headers=headers, media_type=_OCTETS)

    async def weights(self, request: Request) -> Response:
        weights = await self.service.weights(request.path_params["model_id"])
        return Response(encode_weights(weights), media_type="application/json")

    async def fit(self, request: Request) -> Response:
        engine = request.query_params.get("engine", "")
        return web.json_response(await self.service.fit(request.path_params["model_id"], engine))


class _Pulls:
    def __init__(self, service: RegistryService) -> None:
        self.service = service

    async def start(self, request: Request) -> Response:
        return web.json_response(
            await self.service.start_pull(request.path_params["model_id"]), 202
        )

    async def get(self, request: Request) -> Response:
        return web.json_response(await self.service.progress(request.path_params["model_id"]))

    async def cancel(self, request: Request) -> Response:
        return web.json_response(await self.service.cancel(request.path_params["model_id"]))

    async def events(self, request: Request) -> Response:
        snapshots = await self.service.events(request.path_params["model_id"])
        return StreamingResponse(
            _sse(snapshots), media_type="text/event-stream", headers=_SSE_HEADERS
        )


class _Imports:
    def __init__(self, service: RegistryService) -> None:
        self.service = service

    async def start(self, request: Request) -> Response:
        plan = web.decode(_PLAN, await request.body())
        started = await self.service.start_import(request.path_params["model_id"], plan)
        return web.json_response(started, 202)

    async def file(self, request: Request) -> Response:
        """One planned file, as the request's body (streamed: never held whole)."""
        params = request.path_params
        done = await self.service.receive(params["model_id"], params["name"], _body(request))
        return web.json_response(done)


async def _body(request: Request) -> AsyncIterator[bytes]:
    try:
        async for chunk in request.stream():
            if chunk:
                yield chunk
    except ClientDisconnect as exc:
        raise UploadInterrupted("the client disconnected") from exc


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The one byte range a ``Range`` header asks for, as (first, last) inclusive, or None to send
    the whole file (no header, another unit, several ranges or a malformed one: RFC 9110 lets a
    server ignore those). RangeNotSatisfiable when the range starts past the end."""
    unit, _, spec = (header or "").partition("=")
    first, dash, last = spec.strip().partition("-")
    if unit.strip().lower() != "bytes" or not dash or "," in spec:
        return None
    try:
        if not first:  # "bytes=-N": the last N bytes
            start, end = size - int(last), size - 1
            if int(last) <= 0 or size == 0:
                raise RangeNotSatisfiable(f"no bytes in {header!r} of {size}", size=size)
            return max(0, start), end
        start, end = int(first), int(last) if last else size - 1
    except ValueError:
        return None
    if start >= size:
        raise RangeNotSatisfiable(f"{header!r} starts past the end ({size} bytes)", size=size)
    if start < 0 or end < start:
        return None
    return start, min(end, size - 1)


async def _sse(snapshots: AsyncIterator[PullProgress]) -> AsyncIterator[bytes]:
    async for snapshot in snapshots:
        yield b"event: progress\ndata: " + msgspec.json.encode(snapshot) + b"\n\n"


def registry_routes(service: RegistryService) -> list[BaseRoute]:
    models, pulls, imports = _Models(service), _Pulls(service), _Imports(service)
    one = "/api/v1/models/{model_id}"
    return [
        Route("/api/v1/models", models.create, methods=["POST"]),
        Route("/api/v1/models", models.list, methods=["GET"]),
        Route(one, models.get, methods=["GET"]),
        Route(one, models.patch, methods=["PATCH"]),
        Route(one, models.delete, methods=["DELETE"]),
        Route(f"{one}/tokenizer", models.tokenizer, methods=["GET"]),
        Route(f"{one}/weights", models.weights, methods=["GET"]),
        Route(f"{one}/files/{{name:path}}", models.file, methods=["GET"]),  # HEAD too
        Route(f"{one}/fit", models.fit, methods=["GET"]),
        Route(f"{one}/pull", pulls.start, methods=["POST"]),
        Route(f"{one}/pull", pulls.get, methods=["GET"]),
        Route(f"{one}/pull", pulls.cancel, methods=["DELETE"]),
        Route(f"{one}/pull/events", pulls.events, methods=["GET"]),
        Route(f"{one}/import", imports.start, methods=["POST"]),
        Route(f"{one}/import/{{name:path}}", imports.file, methods=["PUT"]),
    ]
