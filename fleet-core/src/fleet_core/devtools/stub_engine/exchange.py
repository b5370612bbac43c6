"""One generation request played out over ASGI, watching the client the whole time.

Starlette's ``StreamingResponse`` would do for the happy path, but a stand-in engine must also
misbehave exactly: on an injected fault the body must end *uncleanly* (hypercorn closes the
connection without the terminating chunk when the app returns mid-body, and logs nothing), and on
a client disconnect generation must stop at once, whether the request is waiting for a slot, in
its latency, or between tokens. `Exchange` owns both, with one watcher task per request.
"""

from __future__ import annotations

import asyncio

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from fleet_core.devtools.stub_engine.engine import Engine
from fleet_core.devtools.stub_engine.frames import Stream, Whole

__all__ = ["Exchange"]

_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]
_JSON = b"application/json"


class Exchange(Response):
    """Plays a prepared `Stream` or `Whole` with the engine's slots, delays and faults."""

    def __init__(
        self, engine: Engine, work: Stream | Whole, *, prompt_tokens: int, prompt_head: str = ""
    ) -> None:
        # Response.__init__ is not called: this response renders itself in __call__.
        self.engine = engine
        self.work = work
        self.prompt_tokens = prompt_tokens
        self.prompt_head = prompt_head

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stats = self.engine.stats
        stats.requests_started += 1
        task = asyncio.current_task()
        assert task is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            task.cancel()

        watcher = asyncio.create_task(watch())
        try:
            completed = await self._play(send)
        except asyncio.CancelledError:
            stats.requests_cancelled += 1
            if gone and task.uncancel() == 0:
                return  # the client left: nothing more to send, nobody to tell
            raise
        finally:
            watcher.cancel()
        if completed:
            stats.requests_finished += 1
        else:
            stats.requests_failed += 1

    async def _play(self, send: Send) -> bool:
        """Send the response; False when the injected fault cut it."""
        async with self.engine.sequence(self.prompt_tokens):
            if delay := self.engine.prefill_delay(self.prompt_head):
                await asyncio.sleep(delay)
            if isinstance(self.work, Whole):
                await self._whole(self.work, send)
                return True
            return await self._stream(self.work, send)

    async def _whole(self, work: Whole, send: Send) -> None:
        if self.engine.token_delay and work.tokens:
            await asyncio.sleep(self.engine.token_delay * work.tokens)
        self.engine.stats.tokens_generated += work.tokens
        length = str(len(work.body)).encode()
        headers = [(b"content-type", _JSON), (b"content-length", length)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": work.body})

    async def _stream(self, work: Stream, send: Send) -> bool:
        engine, stats = self.engine, self.engine.stats
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        for frame in work.opening:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        cut = engine.settings.fail_after_tokens
        if cut is not None and cut > len(work.tokens):
            cut = None  # the reply ends before the fault would strike
        for frame in work.tokens[:cut]:
            if engine.token_delay:
                await asyncio.sleep(engine.token_delay)
            stats.tokens_generated += 1
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        if cut is not None:
            return False  # returning mid-body makes hypercorn drop the connection
        *frames, last = work.closing
        for frame in frames:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": last, "more_body": False})
        return True
