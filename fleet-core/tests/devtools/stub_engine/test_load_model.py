"""The stub's load model: KV occupancy that follows the load, scripted KV pressure,
vLLM's cache_config_info, and a modelled prefix cache that answers faster on a cached prefix."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
from starlette.applications import Starlette

from fleet_core.devtools.stub_engine import StubSettings, main
from fleet_testing.waiting import eventually

from .test_faults import MODEL, stats

Launch = Callable[..., Awaitable[Starlette]]


def chat(system: str, user: str = "hi", max_tokens: int = 3) -> dict[str, object]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens}


def gauge(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(name + "{"))
    return float(line.rsplit(" ", 1)[1])


async def test_kv_occupancy_follows_the_tokens_of_running_requests(
    launch: Launch, http: httpx.AsyncClient
) -> None:
    app = await launch(kv_capacity_tokens=160, kv_baseline=0.25, token_delay_ms=100)
    base = app.state.base_url
    metrics = (await http.get(f"{base}/metrics")).text
    assert gauge(metrics, "vllm:kv_cache_usage_perc") == 0.25  # the scripted pressure alone
    assert 'vllm:cache_config_info{block_size="16",num_gpu_blocks="10"} 1.0' in metrics
    running = asyncio.create_task(http.post(f"{base}/v1/chat/completions", json=chat("a b c d")))

    async def busy() -> bool:
        return bool((await stats(http, app))["running"] == 1)

    await eventually(busy, within=3)
    held = (await stats(http, app))["kv_tokens"]  # 5 prompt words + the whole canned reply
    metrics = (await http.get(f"{base}/metrics")).text
    assert gauge(metrics, "vllm:kv_cache_usage_perc") == pytest.approx(min(1, 0.25 + held / 160))
    assert gauge(metrics, "vllm:gpu_cache_usage_perc") == gauge(metrics, "vllm:kv_cache_usage_perc")
    assert (await running).status_code == 200
    assert (await stats(http, app))["kv_tokens"] == 0


async def test_a_cached_prefix_answers_faster(launch: Launch, http: httpx.AsyncClient) -> None:
    app = await launch(
        latency_ms=300, prefix_cache_chars=16, prefix_hit_latency_ms=0, prefix_cache_entries=2
    )
    url = f"{app.state.base_url}/v1/chat/completions"

    async def timed(system: str, user: str) -> float:
        started = time.monotonic()
        assert (await http.post(url, json=chat(system, user))).status_code == 200
        return time.monotonic() - started

    assert await timed("the same system prompt", "one") >= 0.3  # a miss fills the cache
    assert await timed("the same system prompt", "two") < 0.25  # same first 16 characters
    await timed("another prompt a", "x")
    await timed("another prompt b", "x")  # the LRU of 2 evicts the first prefix
    assert await timed("the same system prompt", "three") >= 0.3
    found = await stats(http, app)
    assert (found["prefix_hits"], found["prefix_misses"]) == (1, 4)


def test_the_cli_knobs_map_onto_settings() -> None:
    argv = ["--model", "m", "--kv-capacity-tokens", "4096", "--kv-baseline", "0.9"]
    argv += ["--prefix-cache-chars", "64", "--prefix-hit-latency-ms", "5"]
    settings = main.settings_from(main.parser().parse_args(argv), {})
    assert (settings.kv_capacity_tokens, settings.kv_baseline) == (4096, 0.9)
    assert (settings.prefix_cache_chars, settings.prefix_hit_latency_ms) == (64, 5.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kv_baseline": 1.5}, "kv_baseline"),
        ({"kv_capacity_tokens": 8}, "kv_capacity_tokens"),
        ({"prefix_cache_entries": 0}, "prefix_cache_entries"),
    ],
)
def test_impossible_knobs_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StubSettings(**fields)  # type: ignore[arg-type]
