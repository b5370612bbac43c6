"""`until_disconnect`: the request's task watches ``receive`` while the answer runs in its own.

Each ``receive`` here behaves as one of the servers does after the request body was read:
uvicorn answers ``http.disconnect`` as soon as the response is complete; hypercorn (and a
server whose client is still there) stays quiet until the client goes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fleet_core.gateway.responses import ClientGone, until_disconnect


class Connection:
    """One client connection as a server's ``receive`` sees it."""

    def __init__(self, *, says_when_complete: bool) -> None:
        self.says_when_complete = says_when_complete
        self.event = asyncio.Event()
        self.gone = False
        self.complete = False
        self.receives = 0

    def respond(self) -> None:
        """The answer's last byte was sent (uvicorn then wakes ``receive``)."""
        self.complete = True
        if self.says_when_complete:
            self.event.set()

    def leave(self) -> None:
        self.gone = True
        self.event.set()

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        await self.event.wait()
        return {"type": "http.disconnect"}


async def test_uvicorn_wakes_the_watcher_and_nothing_is_cancelled() -> None:
    conn = Connection(says_when_complete=True)

    async def answer() -> str:
        await asyncio.sleep(0.01)
        conn.respond()
        return "answered"

    me = asyncio.current_task()
    assert me is not None
    assert await until_disconnect(answer(), conn.receive) == "answered"
    assert me.cancelling() == 0


@pytest.mark.parametrize("says_when_complete", [True, False])
async def test_an_answer_or_its_error_comes_back_whatever_receive_does(
    says_when_complete: bool,
) -> None:
    conn = Connection(says_when_complete=says_when_complete)

    async def answer() -> str:
        await asyncio.sleep(0.01)
        return "answered"

    async def failing() -> str:
        await asyncio.sleep(0.01)
        raise ValueError("the engine said no")

    me = asyncio.current_task()
    assert me is not None
    assert await until_disconnect(answer(), conn.receive) == "answered"
    with pytest.raises(ValueError, match="the engine said no"):
        await until_disconnect(failing(), conn.receive)
    assert me.cancelling() == 0  # the wake-up's cancellation was taken back
    await asyncio.sleep(0)  # and it does not land later
    assert me.cancelling() == 0


async def _slow_answer(ended: list[str]) -> str:
    """An answer that never comes in time, whose cleanup itself awaits (closing the engine's
    side) and then notes in ``ended`` that it ran."""
    try:
        await asyncio.sleep(10)
        return "too late"
    finally:
        await asyncio.sleep(0.01)
        ended.append("cleaned up")


@pytest.mark.parametrize("says_when_complete", [True, False])
async def test_a_client_leaving_cancels_the_answer_and_waits_for_its_end(
    says_when_complete: bool,
) -> None:
    conn = Connection(says_when_complete=says_when_complete)
    ended: list[str] = []
    asyncio.get_running_loop().call_later(0.02, conn.leave)
    with pytest.raises(ClientGone):
        await until_disconnect(_slow_answer(ended), conn.receive)
    assert ended == ["cleaned up"]


@pytest.mark.parametrize("says_when_complete", [True, False])
async def test_a_shutdown_cancels_the_answer_and_stays_a_cancellation(
    says_when_complete: bool,
) -> None:
    conn = Connection(says_when_complete=says_when_complete)
    ended: list[str] = []
    request = asyncio.ensure_future(until_disconnect(_slow_answer(ended), conn.receive))
    await asyncio.sleep(0.01)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert ended == ["cleaned up"]
    assert not conn.gone


async def test_a_shutdown_as_the_answer_ends_is_still_a_cancellation() -> None:
    """The work's end and a shutdown cancel the watcher in the same turn of the loop: the one
    cancellation taken back is the race's own; the shutdown's stays."""
    conn = Connection(says_when_complete=False)
    outer: list[asyncio.Task[str]] = []

    async def answer() -> str:
        await asyncio.sleep(0.01)
        outer[0].cancel()  # the shutdown, just before this task's end cancels the watcher too
        return "answered"

    request = asyncio.ensure_future(until_disconnect(answer(), conn.receive))
    outer.append(request)
    with pytest.raises(asyncio.CancelledError):
        await request


async def test_a_failing_receive_cancels_the_answer_and_leaves_this_task_alone() -> None:
    ended: list[str] = []

    async def broken_receive() -> dict[str, Any]:
        await asyncio.sleep(0.01)
        raise RuntimeError("the server's receive broke")

    async def answer() -> str:
        try:
            await asyncio.sleep(10)
            return "too late"
        finally:
            ended.append("cleaned up")

    me = asyncio.current_task()
    assert me is not None
    with pytest.raises(RuntimeError, match="receive broke"):
        await until_disconnect(answer(), broken_receive)
    assert ended == ["cleaned up"]
    await asyncio.sleep(0.01)  # the answer's end must not cancel this task afterwards
    assert me.cancelling() == 0
