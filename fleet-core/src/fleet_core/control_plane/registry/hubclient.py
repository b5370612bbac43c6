"""A client for the Hugging Face hub HTTP API (the real one, or the synthetic hub).

Two calls: the model info at a revision (``?blobs=true`` for sizes, git blob ids and LFS sha256),
and a file download from ``resolve/{commit}/{path}`` — pinned to the commit the info named, with a
``Range`` to resume. A hub that sends nothing for ``stall_timeout_s`` is abandoned with that reason.
aiohttp's exceptions are translated to ``HubError`` here and nowhere else. The token goes in the
Authorization header only; it is never logged and never part of a reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp

__all__ = ["Download", "HubClient", "HubError", "RemoteFile", "RepoInfo"]


class HubError(Exception):
    """The hub refused, failed or stalled; ``str()`` is the reason shown on the model."""


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None
    """The LFS sha256; None for a file kept in git (then ``blob_id`` is checked)."""
    blob_id: str | None


@dataclass(frozen=True)
class RepoInfo:
    commit: str
    files: tuple[RemoteFile, ...]


@dataclass
class Download:
    start: int
    """Where the body starts: the offset asked for, or 0 when the hub ignored the Range."""
    size: int
    chunks: AsyncIterator[bytes]


class HubClient:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        token: str | None,
        stall_timeout_s: float,
        chunk_size: int = 1 << 20,
    ) -> None:
        self._session, self._base = session, base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._stall, self._chunk = stall_timeout_s, chunk_size
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=stall_timeout_s, sock_read=stall_timeout_s
        )

    async def info(self, repo: str, revision: str) -> RepoInfo:
        url = f"{self._base}/api/models/{repo}/revision/{quote(revision, safe='')}"
        try:
            async with self._session.get(
                url, params={"blobs": "true"}, headers=self._headers, timeout=self._timeout
            ) as response:
                await _check(response, f"{repo}@{revision}")
                body = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise HubError(f"the hub did not answer for {repo}@{revision}: {_why(exc)}") from exc
        return _repo_info(repo, body)

    @contextlib.asynccontextmanager
    async def download(
        self, repo: str, commit: str, file: RemoteFile, *, offset: int = 0
    ) -> AsyncIterator[Download]:
        url = f"{self._base}/{repo}/resolve/{commit}/{quote(file.path)}"
        headers = dict(self._headers)
        if offset:
            headers["Range"] = f"bytes={offset}-"
        try:
            async with self._session.get(url, headers=headers, timeout=self._timeout) as response:
                await _check(response, f"{repo}/{file.path}")
                start = offset if response.status == 206 else 0
                yield Download(start, file.size, self._chunks(response, file, start))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise HubError(self._failure(file, exc)) from exc

    async def _chunks(
        self, response: aiohttp.ClientResponse, file: RemoteFile, start: int
    ) -> AsyncIterator[bytes]:
        received = start
        while chunk := await response.content.read(self._chunk):
            received += len(chunk)
            yield chunk
        if received != file.size:
            raise HubError(
                f"the hub closed the connection after {received} of {file.size} bytes of "
                f"{file.path}"
            )

    def _failure(self, file: RemoteFile, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError):
            return f"the hub sent nothing for {self._stall:g} s while sending {file.path} (stalled)"
        if isinstance(exc, aiohttp.ClientPayloadError):
            return f"the hub closed the connection in the middle of {file.path}: {_why(exc)}"
        return f"fetching {file.path} failed: {_why(exc)}"


async def _check(response: aiohttp.ClientResponse, what: str) -> None:
    if response.status in (200, 206):
        return
    detail = (await response.text())[:200]
    if response.status in (401, 403):
        raise HubError(f"the hub refused access to {what} ({response.status}; set FLEET_HF_TOKEN)")
    raise HubError(f"the hub answered {response.status} for {what}: {detail}")


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _repo_info(repo: str, body: object) -> RepoInfo:
    if not isinstance(body, dict) or not isinstance(body.get("sha"), str):
        raise HubError(f"the hub's model info for {repo} has no commit sha")
    files = []
    for sibling in body.get("siblings") or ():
        name = sibling.get("rfilename") if isinstance(sibling, dict) else None
        if not isinstance(name, str) or ".." in name.split("/") or name.startswith("/"):
            raise HubError(f"the hub's model info for {repo} lists an invalid file {name!r}")
        lfs = sibling.get("lfs") if isinstance(sibling.get("lfs"), dict) else {}
        size = lfs.get("size", sibling.get("size"))
        if not isinstance(size, int):
            raise HubError(f"the hub's model info for {repo} gives no size for {name}")
        sha, blob = lfs.get("sha256"), sibling.get("blobId")
        files.append(
            RemoteFile(
                name,
                size,
                sha if isinstance(sha, str) else None,
                blob if isinstance(blob, str) else None,
            )
        )
    return RepoInfo(body["sha"], tuple(files))
