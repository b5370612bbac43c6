"""OpenAI compatibility: what an SDK user meets first.

A real completion with a usage object; a stream of many frames ending in ``[DONE]`` with usage when
asked (and none when not: a client that did not ask may choke on it); errors as JSON envelopes
rather than a router's 404 page; ``/v1/models``; embeddings.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from fleet_core.cli.smoke.context import Context
from fleet_core.cli.smoke.http import envelope_ok
from fleet_core.cli.smoke.running import Runner

__all__ = ["AREA", "run"]

AREA = "OpenAI"
_HELLO = [{"role": "user", "content": "Say hello to the smoke test in a few words."}]


def usage_ok(usage: Any) -> bool:
    if not isinstance(usage, dict):
        return False
    parts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")]
    if not all(isinstance(p, int) and p >= 0 for p in parts):
        return False
    prompt, completion, total = (int(str(p)) for p in parts)
    return prompt + completion == total


async def run(ctx: Context, runner: Runner) -> None:
    key = await ctx.user_key()
    listed = await ctx.http.call("GET", f"{ctx.gateway}/v1/models", token=key)
    found = listed.json() if listed.status == 200 else None
    ids = [m.get("id") for m in found.get("data", [])] if isinstance(found, dict) else []
    runner.check(AREA, "GET /v1/models lists the served models", bool(ids), ids or listed.brief())
    model = await ctx.model_name(key)
    await _completion(ctx, runner, key, model)
    await _stream(ctx, runner, key, model, include_usage=True)
    await _stream(ctx, runner, key, model, include_usage=False)
    await _errors(ctx, runner, key)
    await _embeddings(ctx, runner, key, model)


async def _completion(ctx: Context, runner: Runner, key: str, model: str) -> None:
    body = {"model": model, "messages": _HELLO, "max_tokens": 16}
    reply = await ctx.http.call("POST", f"{ctx.gateway}/v1/chat/completions", token=key, body=body)
    found = reply.json() if reply.status == 200 else None
    content = _content(found)
    runner.check(
        AREA,
        f"a chat completion from {model!r} has content",
        bool(content),
        content or reply.brief(),
    )
    usage = found.get("usage") if isinstance(found, dict) else None
    runner.check(AREA, "the completion carries a usage object", usage_ok(usage), usage)


def _content(found: Any) -> str:
    try:
        return str(found["choices"][0]["message"]["content"] or "")
    except (KeyError, IndexError, TypeError):
        return ""


async def _stream(
    ctx: Context, runner: Runner, key: str, model: str, *, include_usage: bool
) -> None:
    body: dict[str, Any] = {"model": model, "messages": _HELLO, "max_tokens": 16, "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    frames, done, usages, status = await _frames(ctx, key, body)
    if include_usage:
        ok = status == 200 and len(frames) >= 3 and done
        runner.check(
            AREA,
            "a stream sends many frames, then [DONE]",
            ok,
            f"{status}: {len(frames)} frames, [DONE] {done}",
        )
        runner.check(
            AREA,
            "a stream that asked for usage gets it",
            len(usages) == 1 and usage_ok(usages[0]),
            usages,
        )
    else:
        ok = status == 200 and done and not usages
        runner.check(
            AREA,
            "a stream that did not ask for usage gets none",
            ok,
            f"{status}: usage frames {usages}",
        )


async def _frames(
    ctx: Context, key: str, body: dict[str, Any]
) -> tuple[list[Any], bool, list[Any], int]:
    frames: list[Any] = []
    usages: list[Any] = []
    done, status = False, 0
    url = f"{ctx.gateway}/v1/chat/completions"
    async for code, line in ctx.http.lines(url, token=key, body=body):
        status = code
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            continue
        try:
            frame = json.loads(data)
        except ValueError:
            continue
        frames.append(frame)
        if isinstance(frame, dict) and frame.get("usage"):
            usages.append(frame["usage"])
    return frames, done, usages, status


async def _errors(ctx: Context, runner: Runner, key: str) -> None:
    missing = f"smoke-no-such-model-{secrets.token_hex(3)}"
    body = {"model": missing, "messages": _HELLO}
    reply = await ctx.http.call("POST", f"{ctx.gateway}/v1/chat/completions", token=key, body=body)
    ok = reply.status == 404 and envelope_ok(reply)
    runner.check(AREA, "an unknown model is a 404 error envelope", ok, reply.brief())
    reply = await ctx.http.call("GET", f"{ctx.gateway}/v1/smoke-no-such-route", token=key)
    ok = reply.status == 404 and envelope_ok(reply)
    runner.check(AREA, "an unknown /v1 route is an envelope, not a 404 page", ok, reply.brief())
    reply = await ctx.http.call(
        "POST", f"{ctx.gateway}/v1/chat/completions", token=key, body=["not", "an", "object"]
    )
    ok = reply.status == 400 and envelope_ok(reply)
    runner.check(AREA, "a malformed body is a 400 envelope", ok, reply.brief())


async def _embeddings(ctx: Context, runner: Runner, key: str, model: str) -> None:
    body = {"model": model, "input": ["fleet smoke embedding"]}
    reply = await ctx.http.call("POST", f"{ctx.gateway}/v1/embeddings", token=key, body=body)
    found: Any = reply.json() if reply.status == 200 else None
    try:
        vector = found["data"][0]["embedding"]
        ok = (
            isinstance(vector, list)
            and len(vector) > 0
            and all(isinstance(v, float) for v in vector)
        )
    except (KeyError, IndexError, TypeError):
        vector, ok = None, False
    seen = f"{len(vector)} floats" if ok and vector else reply.brief()
    runner.check(AREA, "embeddings answer a vector", ok, seen)
    usage = found.get("usage") if isinstance(found, dict) else None
    ok = isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int)
    runner.check(AREA, "embeddings carry usage", ok, usage)
