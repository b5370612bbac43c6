"""The synthetic hub: the subset of the Hugging Face hub HTTP API the registry's client uses.

``GET /api/models/{repo}[/revision/{rev}]`` answers the model info (``sha`` = the commit, and
``siblings`` with size, git blob id and, for LFS files, ``lfs.sha256``); ``GET|HEAD
/{repo}/resolve/{rev}/{file}`` serves the bytes with ``ETag``, ``X-Repo-Commit``, ``Accept-Ranges``
and ``Range`` → 206. Each request is recorded in ``Hub.requests`` so tests can prove, say, that a
resumed pull asked only for the missing bytes.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from fleet_core.devtools.hub.repos import HubFile, Repo, default_repos

__all__ = ["Hub", "HubRequest", "create_hub_app"]

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass(frozen=True)
class HubRequest:
    repo: str
    file: str
    range: str | None
    authorized: bool


class Hub:
    """The repositories served, their hashes (computed once, off the loop) and a request log."""

    def __init__(self, repos: Mapping[str, Repo], *, token: str | None = None) -> None:
        self.repos = dict(repos)
        self.token = token
        self.requests: deque[HubRequest] = deque(maxlen=10_000)  # bounded: dev runs for days
        self.requested = asyncio.Event()
        """Set at the first file request: tests await it instead of polling."""
        self._sha256: dict[tuple[str, str], str] = {}
        self._blob: dict[tuple[str, str], str] = {}

    async def info(self, request: Request) -> Response:
        if (denied := self._denied(request)) is not None:
            return denied
        repo = self.repos.get(request.path_params["repo"])
        revision = request.path_params.get("revision", "main")
        if repo is None:
            return JSONResponse({"error": "Repository not found"}, 404)
        if revision not in ("main", repo.commit()):
            return JSONResponse({"error": "Invalid rev id: " + revision}, 404)
        siblings = [await self._sibling(repo, item) for item in repo.files]
        body = {"id": repo.id, "modelId": repo.id, "sha": repo.commit(), "siblings": siblings}
        return JSONResponse(body)

    async def _sibling(self, repo: Repo, item: HubFile) -> dict[str, object]:
        key = (repo.id, item.name)
        if key not in self._blob:
            self._blob[key] = await asyncio.to_thread(item.git_blob_id)
        sibling: dict[str, object] = {
            "rfilename": item.name,
            "size": item.size,
            "blobId": self._blob[key],
        }
        if item.lfs:
            if key not in self._sha256:
                self._sha256[key] = await asyncio.to_thread(item.sha256)
            sha = item.declared_sha256 or self._sha256[key]
            sibling["lfs"] = {"sha256": sha, "size": item.size, "pointerSize": 134}
        return sibling

    async def resolve(self, request: Request) -> Response:
        if (denied := self._denied(request)) is not None:
            return denied
        name, file = request.path_params["repo"], request.path_params["file"]
        repo = self.repos.get(name)
        item = repo.file(file) if repo is not None else None
        if repo is None or item is None:
            return JSONResponse({"error": "Entry not found"}, 404)
        if request.path_params["revision"] not in ("main", repo.commit()):
            return JSONResponse({"error": "Invalid rev id"}, 404)
        asked = request.headers.get("range")
        self.requests.append(HubRequest(name, file, asked, "authorization" in request.headers))
        self.requested.set()
        start, end = _range(asked, item.size)
        if start is None:
            return Response(status_code=416, headers={"Content-Range": f"bytes */{item.size}"})
        headers = {
            "ETag": f'"{await self._etag(repo, item)}"',
            "X-Repo-Commit": repo.commit(),
            "Accept-Ranges": "bytes",
            "Content-Length": str(end - start),
        }
        status = 200
        if asked is not None:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{item.size}"
        if request.method == "HEAD":
            return Response(status_code=status, headers=headers)
        return StreamingResponse(
            _body(item, start, end), status, headers, media_type="application/octet-stream"
        )

    async def _etag(self, repo: Repo, item: HubFile) -> str:
        """The hub's ETag: the LFS sha256 for LFS files, the git blob id for the others."""
        sibling = await self._sibling(repo, item)
        lfs = sibling.get("lfs")
        return str(lfs["sha256"] if isinstance(lfs, dict) else sibling["blobId"])

    def _denied(self, request: Request) -> Response | None:
        if self.token is None or request.headers.get("authorization") == f"Bearer {self.token}":
            return None
        return JSONResponse({"error": "Invalid credentials in Authorization header"}, 401)


def _range(header: str | None, size: int) -> tuple[int | None, int]:
    if header is None:
        return 0, size
    match = _RANGE.match(header.strip())
    if match is None or int(match[1]) >= max(size, 1):
        return None, size
    end = int(match[2]) + 1 if match[2] else size
    return int(match[1]), min(end, size)


async def _body(item: HubFile, start: int, end: int) -> AsyncIterator[bytes]:
    """The bytes ``[start, end)``, misbehaving as the file says (break, stall, throttle)."""
    position = start
    block = 16 * 1024 if item.bytes_per_s else 256 * 1024  # throttled files: smooth progress
    for piece in item.chunks(start, block=block):
        piece = piece[: end - position]
        if item.break_at is not None and position + len(piece) > item.break_at:
            yield piece[: max(0, item.break_at - position)]
            return  # fewer bytes than Content-Length: the server drops the connection
        if item.stall_at is not None and position + len(piece) > item.stall_at:
            yield piece[: max(0, item.stall_at - position)]
            await asyncio.Event().wait()  # holds the connection open, sending nothing
        yield piece
        position += len(piece)
        if item.bytes_per_s:
            await asyncio.sleep(len(piece) / item.bytes_per_s)  # throttling, not synchronisation
        if position >= end:
            return


def create_hub_app(hub: Hub | None = None) -> Starlette:
    """The hub as an ASGI app (mount it, or serve it); ``app.state.hub`` is the ``Hub``."""
    hub = hub or Hub(default_repos())
    app = Starlette(
        routes=[
            Route("/api/models/{repo:path}/revision/{revision}", hub.info, methods=["GET"]),
            Route("/api/models/{repo:path}", hub.info, methods=["GET"]),
            Route(
                "/{repo:path}/resolve/{revision}/{file:path}",
                hub.resolve,
                methods=["GET", "HEAD"],
            ),
        ]
    )
    app.state.hub = hub
    return app
