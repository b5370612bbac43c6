"""Stopping background loops for sure, within a bound.

A loop stops when its task is cancelled, unless something beneath it swallows the cancellation.
On Python 3.11 ``asyncio.wait_for`` does, when the outer task is cancelled in the same loop
iteration as the awaited future completes (CPython gh-86296, rewritten in 3.12), and psycopg_pool
waits for a pooled connection with it: a loop cancelled just as the pool hands it a connection
carries on, and a shutdown that awaits it waits for ever. CI met exactly that: the gateway's
key-usage loop outlived its cancellation and hypercorn gave up on the lifespan after 60 s.

- `raise_if_cancelled`: a loop calls it once per round. A swallowed cancellation still counts in
  the task's ``cancelling()``, so the loop ends at its next round instead of running on.
- `stop`: cancel tasks, and cancel again those still running, for at most ``within_s``; the
  tasks still running then are named on one log line and left behind, so shutdown goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any

__all__ = ["RECANCEL_S", "raise_if_cancelled", "stop"]

log = logging.getLogger("fleet.stopping")

RECANCEL_S = 0.5
"""How long `stop` waits after a cancellation before it cancels a task again."""


def raise_if_cancelled() -> None:
    """Raise CancelledError if the current task was asked to stop, even if the cancellation was
    swallowed on its way (a loop's round that saw none is not stopped)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling() > 0:
        raise asyncio.CancelledError


async def stop(tasks: Collection[asyncio.Future[Any]], *, within_s: float) -> list[str]:
    """Cancel ``tasks`` and wait until they end, cancelling again every `RECANCEL_S`, for at
    most ``within_s``. Returns the names of those still running then (and logs them once)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_S, left))
    names = sorted(_name(task) for task in pending)
    if names:
        log.error("left running at shutdown (did not stop within %.1fs): %s", within_s, names)
    return names


def _name(task: asyncio.Future[Any]) -> str:
    return task.get_name() if isinstance(task, asyncio.Task) else repr(task)
