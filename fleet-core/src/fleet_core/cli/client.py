"""The control plane's registry API as ``fleet models`` calls it (aiohttp, JSON in and out)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

__all__ = ["Api", "ApiError"]


class ApiError(Exception):
    """The control plane refused; ``str()`` is its status and error message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class Api:
    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session, self.base = session, base.rstrip("/")

    async def call(self, method: str, path: str, body: object = None) -> Any:
        async with self.session.request(method, self.base + path, json=body) as response:
            return await _payload(response)

    async def upload(self, path: str, body: AsyncIterator[bytes], size: int) -> Any:
        """PUT ``body`` (``size`` bytes, streamed) with no overall time limit: a file may be
        large, and the answer to the last one comes after the model was parsed."""
        timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        async with self.session.put(
            self.base + path, data=body, headers=headers, timeout=timeout
        ) as response:
            return await _payload(response)

    async def events(self, model_id: str) -> AsyncIterator[dict[str, Any]]:
        url = f"{self.base}/api/v1/models/{model_id}/pull/events"
        async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=None)) as response:
            if response.status >= 400:
                raise ApiError(response.status, await response.text())
            async for line in response.content:
                if line.startswith(b"data: "):
                    yield json.loads(line[6:])


async def _payload(response: aiohttp.ClientResponse) -> Any:
    payload = await response.json(content_type=None)
    if response.status >= 400:
        error = payload.get("error", {}) if isinstance(payload, dict) else {}
        raise ApiError(response.status, str(error.get("message", payload)))
    return payload
