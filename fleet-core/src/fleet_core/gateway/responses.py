"""Racing an answer against the client going away, so upstream work stops the moment it goes.

Starlette's own responses only look for ``http.disconnect`` between chunks, so a stream waiting on
a slow engine would keep the engine generating for a client that left. Here the work runs as a task
raced against the disconnect message; when the client goes, the task is cancelled, which aborts the
engine connection (the engine stops). When the racing task is itself cancelled (shutdown), the work
is cancelled and awaited too, so nothing outlives the request that started it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.types import Message, Receive, Send

__all__ = ["SSE_HEADERS", "ClientGone", "until_disconnect", "watch_start"]

T = TypeVar("T")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class ClientGone(Exception):
    """The client disconnected before the answer was complete."""


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _stop(task: asyncio.Future[Any]) -> None:
    if not task.done():
        task.cancel()
        await asyncio.wait({task})


async def until_disconnect(work: Awaitable[T], receive: Receive) -> T:
    """Await ``work``; cancel it and raise ClientGone if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        watcher.cancel()
        await _stop(task)
        raise
    watcher.cancel()
    if task.done():
        return task.result()
    await _stop(task)
    raise ClientGone


def watch_start(send: Send) -> tuple[Send, list[bool]]:
    """``send`` wrapped to note (in the returned one-item list) whether the response started."""
    started = [False]

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            started[0] = True
        await send(message)

    return wrapped, started
