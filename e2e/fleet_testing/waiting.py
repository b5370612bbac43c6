"""Waiting for what another process or task does: a condition, or a server's URL answering.

What a test waits for happens elsewhere (an operator in another process, a writer task, a server
starting), with no hook to say "done", so the observable state is polled at a short interval,
never replaced by a fixed sleep. `eventually` is the one way to poll, in a coroutine, with a check
that is a plain function or a coroutine function; `eventually_blocking` is its twin for
synchronous code (sync fixtures, the end-to-end system, benchmarks), on the same `_Patience`.
`until_answers` waits for a process's URL to answer, failing at once when the process exits.

A check returns something truthy when the condition holds; that value is returned, so a check can
hand over what it found. Past ``within`` seconds the wait fails with an ``AssertionError`` naming
``what`` it waited for (the caller's source line when ``what`` is not given); ``what`` may be a
function, called at the deadline, to say what the check last saw.
"""

from __future__ import annotations

import asyncio
import inspect
import linecache
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

__all__ = ["INTERVAL_S", "eventually", "eventually_blocking", "until_answers"]

T = TypeVar("T")
What = str | Callable[[], str] | None
"""What a wait waits for: said as is, or a function called at the deadline (what was last seen)."""
INTERVAL_S = 0.05
"""Between two checks: short next to every wait here, long next to a check."""


class _Patience:
    """The deadline of one wait, and what the failure says when it passes."""

    def __init__(self, within: float, what: What) -> None:
        self.within = within
        self.deadline = time.monotonic() + within
        self.what = what if what is not None else _caller_line(depth=3)

    def spent(self) -> None:
        """Fail if the deadline has passed (checked after a failed check, so one always runs)."""
        if time.monotonic() > self.deadline:
            what = self.what() if callable(self.what) else self.what
            raise AssertionError(f"not within {self.within:g} s: {what}")


@overload
async def eventually(  # a check returning an awaitable is awaited
    check: Callable[[], Awaitable[T | None]],
    *,
    within: float,
    what: What = None,
    interval: float = INTERVAL_S,
) -> T: ...
@overload
async def eventually(
    check: Callable[[], T | None], *, within: float, what: What = None, interval: float = ...
) -> T: ...
async def eventually(
    check: Callable[[], object],
    *,
    within: float,
    what: What = None,
    interval: float = INTERVAL_S,
) -> object:
    """Until ``check()`` (awaited if it is a coroutine function) returns something truthy; that."""
    patience = _Patience(within, what)
    while True:
        found = check()
        if inspect.isawaitable(found):
            found = await found
        if found:
            return found
        patience.spent()
        await asyncio.sleep(interval)


def eventually_blocking(
    check: Callable[[], T | None],
    *,
    within: float,
    what: What = None,
    interval: float = INTERVAL_S,
) -> T:
    """`eventually` for synchronous code: the thread sleeps between checks."""
    patience = _Patience(within, what)
    while not (found := check()):
        patience.spent()
        time.sleep(interval)
    return found


def until_answers(
    url: str, process: subprocess.Popen[Any], *, within: float = 60.0, what: str = ""
) -> None:
    """Until ``url`` answers with a 2xx status; fails at once if ``process`` exits first (with
    what it wrote to its stderr, when that is a pipe)."""

    def answered() -> bool:
        if process.poll() is not None:
            said = process.stderr.read() if process.stderr else ""
            said = said.decode(errors="replace") if isinstance(said, bytes) else said
            exited = f"{what or repr(process.args)} exited with {process.returncode}"
            raise AssertionError(f"{exited}: {said.strip()[-2000:]}" if said else exited)
        return _answers(url)

    eventually_blocking(answered, within=within, what=f"{what or url} answering {url}")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return 200 <= int(answer.status) < 300
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the response's socket
        return False
    except OSError:
        return False


def _caller_line(*, depth: int) -> str:
    """``file:line: source`` of the frame ``depth`` levels up (the code that called the wait)."""
    frame = sys._getframe(depth)
    source = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return f"{frame.f_code.co_filename}:{frame.f_lineno}: {source}"
