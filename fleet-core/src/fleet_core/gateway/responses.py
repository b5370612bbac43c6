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
from typing import TypeVar

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


async def until_disconnect(work: Awaitable[T], receive: Receive) -> T:
    """Await ``work``; cancel it and raise ClientGone if the client disconnects first.

    The work runs as its own task, so a cancellation meant for it never lands in this one. When
    this task is cancelled (shutdown) while awaiting it, asyncio cancels the work too and this
    task resumes only once the work has finished. A done callback, not ``asyncio.wait``: the
    race costs one callback per request, not a waiter and two callbacks per wake-up."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    watcher.add_done_callback(lambda _: task.cancel())  # no-op once the work is done
    try:
        return await task
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():  # the client left, not a shutdown
            raise ClientGone from None
        raise
    finally:
        watcher.cancel()


def watch_start(send: Send) -> tuple[Send, list[bool]]:
    """``send`` wrapped to note (in the returned one-item list) whether the response started."""
    started = [False]

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            started[0] = True
        await send(message)

    return wrapped, started
