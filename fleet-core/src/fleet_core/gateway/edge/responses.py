"""Racing an answer against the client going away, so upstream work stops the moment it goes.

Starlette's own responses only look for ``http.disconnect`` between chunks, so a stream waiting on
a slow engine would keep the engine generating for a client that left. Here the work runs as a task
raced against the disconnect message; when the client goes, the task is cancelled, which aborts the
engine connection (the engine stops). When the racing task is itself cancelled (shutdown), the work
is cancelled and awaited too, so nothing outlives the request that started it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, Coroutine
from typing import Any, TypeVar

from starlette.types import Receive, Send

__all__ = ["SSE_HEADERS", "ClientGone", "send_stream", "until_disconnect"]

T = TypeVar("T")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


async def send_stream(send: Send, frames: AsyncIterable[tuple[bytes, bool]]) -> None:
    """An event stream: its head, then each read's frames in one body message as they come.
    The frames that came with the engine's end carry ``more_body: False`` themselves (one
    message and one write fewer than an empty body after them); a stream broken off before its
    end ends with whatever raised."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    async for body, more in frames:
        await send({"type": "http.response.body", "body": body, "more_body": more})


class ClientGone(Exception):
    """The client disconnected before the answer was complete."""


async def until_disconnect(work: Coroutine[Any, Any, T], receive: Receive) -> T:
    """Await ``work``; cancel it and raise ClientGone if the client disconnects first.

    The work runs as its own task, so a cancellation meant for it never lands in this one; this
    task watches ``receive`` meanwhile (one task per request besides the server's, not two).
    Under uvicorn ``receive`` answers ``http.disconnect`` the moment the response is complete,
    so the usual request wakes this task without anything being cancelled. Where ``receive``
    stays quiet (another server, an error before any byte), the work's end cancels this task's
    wait, a cancellation taken back at once (``uncancel``). When this task is cancelled from
    elsewhere (shutdown), the work is cancelled too and awaited before the cancellation goes on,
    so nothing outlives the request that started it."""
    me = asyncio.current_task()
    assert me is not None
    task = asyncio.create_task(work)
    race = _Race(me)
    task.add_done_callback(race.work_done)
    try:
        while not task.done() and (await receive())["type"] != "http.disconnect":
            pass
    except asyncio.CancelledError:
        if not (race.woken and me.uncancel() == 0):  # not (only) the work's end: a shutdown
            await _abandon(task, race)
            raise
    except BaseException:  # receive itself failed
        await _abandon(task, race)
        raise
    race.watching = False
    if not task.done():  # the client left first
        task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            if me.cancelling():  # cancelled from elsewhere meanwhile: stay cancelled
                raise
            raise ClientGone from None
    return task.result()


async def _abandon(task: asyncio.Future[T], race: _Race) -> None:
    """Stop watching, cancel the work and wait for its end (its ``finally`` blocks included);
    the caller's own exception is what goes on."""
    race.watching = False
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


class _Race:
    """Whether `until_disconnect` is still watching, and whether the work's end woke it."""

    __slots__ = ("task", "watching", "woken")

    def __init__(self, task: asyncio.Task[object]) -> None:
        self.task, self.watching, self.woken = task, True, False

    def work_done(self, _: object) -> None:
        if self.watching:
            self.woken = True
            self.task.cancel()
