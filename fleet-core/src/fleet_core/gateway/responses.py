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

    The work runs in this task, raced against one watcher task reading ``receive``: when the
    client goes, the watcher cancels this task, and the cancellation is taken back
    (``uncancel``) and turned into ClientGone here. A cancellation from elsewhere (shutdown)
    stays a cancellation. One task per request, not two: a task for the work would cost as much
    again, and the work's cancellation would then have to be awaited across tasks."""
    task = asyncio.current_task()
    assert task is not None
    race = _Race(task)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    watcher.add_done_callback(race.client_left)
    try:
        return await work
    except asyncio.CancelledError:
        if race.gone and task.uncancel() == 0:  # ours alone: the client left, not a shutdown
            raise ClientGone from None
        raise
    finally:
        race.over = True
        watcher.cancel()


class _Race:
    __slots__ = ("gone", "over", "task")

    def __init__(self, task: asyncio.Task[object]) -> None:
        self.task, self.gone, self.over = task, False, False

    def client_left(self, watcher: asyncio.Future[None]) -> None:
        if self.over or watcher.cancelled() or watcher.exception() is not None:
            return
        self.gone = True
        self.task.cancel()


def watch_start(send: Send) -> tuple[Send, list[bool]]:
    """``send`` wrapped to note (in the returned one-item list) whether the response started."""
    started = [False]

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            started[0] = True
        await send(message)

    return wrapped, started
