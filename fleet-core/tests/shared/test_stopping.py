"""`stopping.stop` ends background loops within its bound, whatever they do with a cancellation.

The loops here are real tasks shaped like the failures: one swallows its first cancellation (what
CPython 3.11's ``wait_for`` did to the gateway's key-usage loop, see
``admission/test_loop_cancelling.py``), one ignores every cancellation (a bug we cannot foresee).
Bounds are behaviour deadlines with room for a loaded machine, not speed targets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from fleet_core.shared import stopping

SLACK_S = 1.0
"""Room for a loaded machine on top of a bound."""


async def _swallows_once() -> None:
    swallowed = False
    while True:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed = True


async def _ignores_cancelling(released: asyncio.Event) -> None:
    while not released.is_set():
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            continue


async def test_stop_cancels_again_a_loop_that_swallowed_its_cancellation() -> None:
    task = asyncio.create_task(_swallows_once(), name="swallower")
    await asyncio.sleep(0)
    started = asyncio.get_running_loop().time()
    assert await stopping.stop([task], within_s=5) == []
    assert task.cancelled()
    assert asyncio.get_running_loop().time() - started < stopping.RECANCEL_S + SLACK_S


async def test_stop_gives_up_within_its_bound_and_names_what_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    released = asyncio.Event()
    stubborn = asyncio.create_task(_ignores_cancelling(released), name="stubborn")
    polite = asyncio.create_task(asyncio.sleep(60), name="polite")
    await asyncio.sleep(0)
    started = asyncio.get_running_loop().time()
    with caplog.at_level(logging.ERROR, logger="fleet.stopping"):
        assert await stopping.stop([stubborn, polite], within_s=1.0) == ["stubborn"]
    assert asyncio.get_running_loop().time() - started < 1.0 + SLACK_S
    assert polite.cancelled()
    [line] = [r.getMessage() for r in caplog.records if r.name == "fleet.stopping"]
    assert "stubborn" in line
    assert "polite" not in line
    assert not stubborn.done()
    released.set()  # only its own flag ends it
    await asyncio.wait({stubborn}, timeout=2)


async def test_a_loop_that_checks_ends_at_its_next_round_after_a_swallowed_cancel() -> None:
    rounds: list[int] = []

    async def loop() -> None:
        while True:
            await _swallows_once_then_returns()
            rounds.append(1)
            stopping.raise_if_cancelled()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    task.cancel()  # swallowed inside the round
    done, _ = await asyncio.wait({task}, timeout=2)
    assert done
    assert task.cancelled()
    assert rounds == [1]  # it finished the round it was in, and no other


async def _swallows_once_then_returns() -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0.05)


async def test_a_task_never_cancelled_is_not_stopped_by_the_check() -> None:
    async def one_round() -> str:
        stopping.raise_if_cancelled()
        return "ran"

    assert await asyncio.create_task(one_round()) == "ran"
