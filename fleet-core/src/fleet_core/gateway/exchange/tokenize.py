"""The engine's own count of generated text, for a stream that ended without its usage frame.

When a client leaves before the engine's usage frame, the record falls back to the gateway's
count of what was relayed. For a pool without a ``tokenizer.json`` that count is the upper
estimate (`metering.counting.estimate_tokens`, one token per byte: ADR 0022), which errs high on
purpose. The engine that generated the text holds the model's real tokenizer, and both engines
we run serve it: ``POST /tokenize`` on vLLM (``{"model", "prompt"}`` → ``{"count", "tokens"}``)
and on llama-server (``{"content"}`` → ``{"tokens"}``). So before falling back, the gateway asks
the endpoint that answered to count the text, for at most `TOKENIZE_TIMEOUT_S`; any failure (no
such route, an error, a timeout, a body it cannot read) leaves the estimate in place.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import msgspec

from fleet_core.gateway.exchange.routing.table import Target

__all__ = ["METHOD", "TOKENIZE_TIMEOUT_S", "engine_count"]

log = logging.getLogger("fleet.gateway.proxy")

METHOD = "engine:tokenize"
"""The count method a record carries when its completion was counted by the engine."""
TOKENIZE_TIMEOUT_S = 1.0
"""The most one count may take; the record waits for it, the client does not."""


class _Counted(msgspec.Struct):
    count: int | None = None
    tokens: list[int | str | list[int | str]] | None = None


_decoder = msgspec.json.Decoder(_Counted)


async def engine_count(
    session: aiohttp.ClientSession, target: Target, model: str, text: str
) -> int | None:
    """How many tokens ``target``'s engine makes of ``text``; None if it could not say."""
    body = {"model": model, "prompt": text, "content": text, "add_special_tokens": False}
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    try:
        async with (
            asyncio.timeout(TOKENIZE_TIMEOUT_S),
            session.post(target.url + "/tokenize", json=body, headers=headers) as response,
        ):
            if response.status != 200:
                return None
            counted = _decoder.decode(await response.read())
    except (TimeoutError, aiohttp.ClientError, msgspec.DecodeError) as exc:
        log.debug("the engine at %s could not count tokens: %s", target.url, exc)
        return None
    if counted.count is not None and counted.count >= 0:
        return counted.count
    return None if counted.tokens is None else len(counted.tokens)
