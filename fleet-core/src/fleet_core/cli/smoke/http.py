"""The smoke command's HTTP: every answer as a ``Reply``, a refused connection included.

Checks print what they saw, so a connection that failed is a reply with status 0 and the error
as its text rather than an exception that would end the run without a line saying where.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

__all__ = ["Http", "Reply", "envelope_ok"]

_TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=10)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "").lower()

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def brief(self) -> str:
        """Status and the start of the body, for a check's observed value."""
        return f"{self.status} {self.text[:100]}"


def envelope_ok(reply: Reply) -> bool:
    """An OpenAI-style error envelope: JSON ``{"error": {"message": ..., "type": ...}}``."""
    found = reply.json()
    error = found.get("error") if isinstance(found, dict) else None
    return isinstance(error, dict) and isinstance(error.get("message"), str) and "type" in error


class Http:
    """Thin calls over one aiohttp session; ``token`` becomes ``Authorization: Bearer``."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    @staticmethod
    def open() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(timeout=_TIMEOUT)

    async def call(
        self,
        method: str,
        url: str,
        *,
        token: str | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        sent = _headers(token, headers, json_body=body is not None)
        data = None if body is None else json.dumps(body).encode()
        try:
            async with self.session.request(method, url, data=data, headers=sent) as response:
                return Reply(response.status, await response.read(), dict(response.headers))
        except (aiohttp.ClientError, TimeoutError) as exc:
            return Reply(0, f"{type(exc).__name__}: {exc}".encode())

    async def lines(
        self, url: str, *, token: str | None, body: Any
    ) -> AsyncGenerator[tuple[int, str]]:
        """A streamed POST's status, then each non-empty line as it arrives."""
        sent = _headers(token, None, json_body=True)
        async with self.session.post(url, data=json.dumps(body).encode(), headers=sent) as resp:
            async for raw in resp.content:
                line = raw.decode("utf-8", "replace").strip()
                if line:
                    yield resp.status, line


def _headers(
    token: str | None, extra: Mapping[str, str] | None, *, json_body: bool
) -> dict[str, str]:
    out = {"Authorization": f"Bearer {token}"} if token else {}
    if json_body:
        out["Content-Type"] = "application/json"
    return {**out, **(extra or {})}
