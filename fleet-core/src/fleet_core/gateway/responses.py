"""ASGI responses that notice a client going away and cancel the upstream work at once.

Starlette's own responses only look for ``http.disconnect`` between chunks, so a stream waiting on
a slow engine would keep the engine generating for a client that left. Here the work runs as a task
raced against the disconnect message; when the client goes, the task is cancelled, which aborts the
engine connection (the engine stops) and still writes the usage record in its ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from starlette.types import Receive, Scope, Send

__all__ = ["ClientGone", "StreamResponse", "until_disconnect"]

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(work: Awaitable[T], receive: Receive) -> T:
    """Await ``work``; cancel it and raise ClientGone if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientGone


class StreamResponse:
    """Server-sent events, each frame sent (and so flushed) the moment it is produced."""

    def __init__(
        self,
        frames: AsyncIterator[bytes],
        *,
        status: int = 200,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.frames = frames
        self.status = status
        self.on_end = on_end  # runs however the response ends, even if ``frames`` never started

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": self.status,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        try:
            await until_disconnect(self._pump(send), receive)
        except ClientGone:
            return
        finally:
            if self.on_end is not None:
                self.on_end()

    async def _pump(self, send: Send) -> None:
        try:
            async for frame in self.frames:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            aclose = getattr(self.frames, "aclose", None)
            if aclose is not None:
                await aclose()
