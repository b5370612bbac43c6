"""Retry-After is the true wait: a refusal does not ignore this gateway's own refunds in flight.

A large request that had just finished left its unused reservation in the settlement window
(refunds are summed for a few milliseconds before they are sent). The same request sent at once
on the same connection was refused with Retry-After: 41, and passed 50 ms later.
"""

from __future__ import annotations

import asyncio
import math

import httpx

from fleet_testing.fix_fault_engine import answer

from .conftest import MSG, TPM, RigFactory

LARGE = {"model": "m", "messages": MSG, "max_tokens": 5000}
"""Reserves most of the `TPM` bucket; the engine's answer uses a few tokens of it."""


async def test_a_large_request_right_after_another_is_not_told_to_wait(
    start_rig: RigFactory,
) -> None:
    rig = await start_rig()
    async with httpx.AsyncClient(base_url=rig.gw.url, timeout=30) as http:
        for _ in range(5):
            first = await http.post("/v1/chat/completions", json=LARGE)
            right_after = await http.post("/v1/chat/completions", json=LARGE)
            assert first.status_code == 200, first.text
            assert right_after.status_code == 200, right_after.headers.get("retry-after")
            await asyncio.sleep(0.2)
    await rig.books.check(admitted=10)


async def test_a_real_refusal_still_says_how_long(start_rig: RigFactory) -> None:
    """When the bucket really is spent, the wait is the bucket's refill time, no more."""
    rig = await start_rig()
    spent = {"prompt_tokens": 3, "completion_tokens": 4997, "total_tokens": 5000}
    message = {"role": "assistant", "content": "long"}
    rig.engine.then([answer(200, {"choices": [{"index": 0, "message": message}], "usage": spent})])
    async with httpx.AsyncClient(base_url=rig.gw.url, timeout=30) as http:
        assert (await http.post("/v1/chat/completions", json=LARGE)).status_code == 200
        refused = await http.post("/v1/chat/completions", json=LARGE)
    assert refused.status_code == 429, refused.text
    wait = int(refused.headers["retry-after"])
    # the bucket holds about TPM - 5000 and needs the reservation: this much refill, rounded up
    reserved = 5000 + 30  # max_tokens plus the prompt's upper estimate (under 30 bytes)
    assert wait <= math.ceil((reserved - (TPM - 5000)) / (TPM / 60)) + 1
    await rig.books.check(admitted=1)
