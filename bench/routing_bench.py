"""Routing that knows the engines: KV-pressure avoidance, prefix affinity's hit rate
and latency against least-outstanding, the load spread of a hot prefix, and the fair queue's
wait bound. ``FLEET_BENCH_ONLY=routing`` runs this section.

Stub engines and the gateway are separate processes, as in the gateway section; the gateway is
``fleet-gateway`` as shipped (``shipped``: one worker, its default server). The stubs model what
matters: a KV-pressured engine answers slower (it would preempt), a cached prompt prefix answers
faster. So the engines stay the Python stub (``fleet_core.devtools.stub_engine``), which models KV
occupancy, a prefix cache and fixed latencies and counts them on ``/stats``, where the Go stub of
the other sections models none of these; its CPU matters little here, as each request waits
20-200 ms of modelled time. And the load stays in this process (aiohttp, closed loop): the Go
generator sends one fixed body, and these clients vary the prompt and the tenant per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from bench import shipped
from bench.gateway_bench import median, process
from fleet_testing.ports import free_port

__all__ = ["report", "run"]

SECONDS = float(os.environ.get("FLEET_BENCH_SECONDS", "3"))
ROUNDS = int(os.environ.get("FLEET_BENCH_ROUNDS", "3"))
CONCURRENCY = 6
EPSILON = 0.25
KEYS = {"FLEET_AUTH_REQUIRED": "true", "FLEET_API_KEYS": "A/p/ka;B/p/kb"}
Result = dict[str, Any]


@contextlib.contextmanager
def stubs(*knobs: dict[str, Any]) -> Iterator[list[str]]:
    urls = []
    with contextlib.ExitStack() as stack:
        for knob in knobs:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            flags = [f"--{k.replace('_', '-')}={v}" for k, v in knob.items()]
            args = [sys.executable, "-m", "fleet_core.devtools.stub_engine", "--port", str(port)]
            stack.enter_context(process([*args, "--model", "m", *flags], url + "/health"))
            urls.append(url)
        yield urls


@contextlib.contextmanager
def gateway(config: dict[str, Any], env: dict[str, str] | None = None) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fleet.yaml"
        path.write_text(json.dumps(config))  # JSON is YAML
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with process(shipped.command(path, port), url + "/healthz", {**shipped.ENV, **(env or {})}):
            time.sleep(1.0)  # a few health rounds: signals scraped
            yield url


def stats(url: str) -> dict[str, int]:
    with urllib.request.urlopen(url + "/stats", timeout=5) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def chat(system: str, user: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return {"model": "m", "messages": messages, "max_tokens": 16}


async def closed_loop(url: str, make: Any, seconds: float, concurrency: int) -> list[float]:
    """Latencies (ms) of ``concurrency`` clients sending ``make(rng)`` bodies for ``seconds``."""
    latencies: list[float] = []
    end = time.monotonic() + seconds

    async def client(session: aiohttp.ClientSession, seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < end:
            started = time.monotonic()
            try:
                async with session.post(url + "/v1/chat/completions", json=make(rng)) as response:
                    await response.read()
                    if response.status == 200:
                        latencies.append((time.monotonic() - started) * 1000)
            except aiohttp.ClientError as exc:  # counted out, not fatal: say so and go on
                print(f"bench: routing request failed: {exc}", file=sys.stderr)
                await asyncio.sleep(0.1)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session, i) for i in range(concurrency)))
    return latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def interleaved(measure: Any, variants: tuple[Any, ...]) -> dict[str, Result]:
    """``measure(variant)`` for each variant, ``ROUNDS`` times interleaved so that the machine's
    drift falls on all alike; each figure is the median over rounds."""
    runs: dict[str, list[Result]] = {}
    for _ in range(ROUNDS):
        for variant in variants:
            name, result = measure(variant)
            runs.setdefault(name, []).append(result)
    return {name: _medians(results) for name, results in runs.items()}


def _medians(results: list[Result]) -> Result:
    first = results[0]
    out: Result = {}
    for key, value in first.items():
        if isinstance(value, list):
            out[key] = [median([r[key][i] for r in results]) for i in range(len(value))]
        else:
            out[key] = median([r[key] for r in results])
    return out


def _kv_once(variant: tuple[str, float]) -> tuple[str, Result]:
    """Two engines, one at 95% KV occupancy (modelled 4x slower, as preemption makes it)."""
    name, penalty = variant
    with stubs({"latency_ms": 160, "kv_baseline": 0.95}, {"latency_ms": 40}) as urls:
        config = {
            "health": {"interval_s": 0.2},
            "routing": {"kv_penalty": penalty},
            "upstreams": [{"id": "x", "model": "m", "endpoints": urls}],
        }
        with gateway(config) as gw:
            lat = asyncio.run(closed_loop(gw, lambda rng: chat("s", "u"), SECONDS, 4))
        pressured = stats(urls[0])["requests_started"]
        total = pressured + stats(urls[1])["requests_started"]
    return name, {
        "share": pressured / max(total, 1),
        "rps": len(lat) / SECONDS,
        "p50": median(lat),
        "p99": pct(lat, 0.99),
    }


def kv_pressure() -> dict[str, Result]:
    return interleaved(_kv_once, (("least-outstanding", 0.0), ("score (KV penalty)", 8.0)))


PREFIXES = [f"You are assistant number {i}. " * 12 for i in range(24)]
CACHE_ENTRIES = 10
"""Prefixes each engine's cache holds: fewer than the 24 in play, as a KV cache is smaller
than a fleet's working set; affinity splits the set so each engine's share fits."""


def skewed(rng: random.Random) -> dict[str, Any]:
    """Half the traffic on one hot system prompt, the rest over 23 others."""
    prefix = PREFIXES[0] if rng.random() < 0.5 else rng.choice(PREFIXES[1:])
    return chat(prefix, f"question {rng.randrange(10**6)}")


def _prefix_once(policy: str) -> tuple[str, Result]:
    cache = {
        "latency_ms": 200,
        "prefix_cache_chars": 256,
        "prefix_hit_latency_ms": 20,
        "prefix_cache_entries": CACHE_ENTRIES,
    }
    with stubs(cache, cache, cache) as urls:
        config = {
            "routing": {"prefix_chars": 256, "affinity_epsilon": EPSILON},
            "upstreams": [{"id": "x", "model": "m", "endpoints": urls, "routing": policy}],
        }
        with gateway(config) as gw:
            lat = asyncio.run(closed_loop(gw, skewed, SECONDS, CONCURRENCY))
        found = [stats(u) for u in urls]
    hits = sum(s["prefix_hits"] for s in found)
    total = sum(s["prefix_hits"] + s["prefix_misses"] for s in found)
    return policy, {
        "hit_rate": hits / max(total, 1),
        "rps": len(lat) / SECONDS,
        "p50": median(lat),
        "p99": pct(lat, 0.99),
        "peak": max(s["peak_running"] for s in found),
        "shares": sorted(s["requests_started"] / max(total, 1) for s in found),
    }


def prefix_affinity() -> dict[str, Result]:
    return interleaved(_prefix_once, ("least_load", "prefix_affinity"))


def fairness() -> Result:
    """Tenant A queues 100 long requests on a 2-slot endpoint, then B sends 5."""
    with stubs({"latency_ms": 20}) as urls:
        config = {
            "queue_timeout_s": 120,
            "upstreams": [{"id": "x", "model": "m", "base_url": urls[0], "slots": 2}],
        }
        with gateway(config, env=KEYS) as gw:
            return asyncio.run(_fair_run(gw))


async def _fair_run(gw: str) -> Result:
    done: list[str] = []
    waits: dict[str, list[float]] = {"A": [], "B": []}

    async def send(session: aiohttp.ClientSession, tenant: str) -> None:
        started = time.monotonic()
        headers = {"Authorization": f"Bearer {tenant}/p/k{tenant.lower()}"}
        body = {**chat("s", "u"), "max_tokens": 1000}
        async with session.post(gw + "/v1/chat/completions", json=body, headers=headers) as r:
            await r.read()
        waits[tenant].append((time.monotonic() - started) * 1000)
        done.append(tenant)

    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
        a = [asyncio.create_task(send(s, "A")) for _ in range(100)]
        await asyncio.sleep(0.5)  # A's backlog is queued
        mark = len(done)
        await asyncio.gather(*(send(s, "B") for _ in range(5)))
        behind = done[mark:].count("A")
        await asyncio.gather(*a)
    return {"a_before_b": behind, "b_max": max(waits["B"]), "a_p50": median(waits["A"])}


Results = dict[str, Any]


def run() -> Results:
    return {"kv": kv_pressure(), "prefix": prefix_affinity(), "fair": fairness()}


def report(results: Results) -> list[str]:
    kv, prefix, fair = results["kv"], results["prefix"], results["fair"]
    bound = -(-(1 + EPSILON) * CONCURRENCY // 3)
    lines = [
        "## Routing",
        "",
        f"Closed loop, {SECONDS:g} s per policy and round, the median of {ROUNDS} interleaved",
        "rounds; latencies in ms. The machine is shared: latencies carry tens of ms of CPU",
        "contention, so compare policies within the table. The stubs model the engines:",
        "a KV-pressured one answers 4x slower (160 vs 40 ms), a cached prefix 10x faster (20",
        "vs 200 ms), long enough that the model, not the CPU, dominates. Least-outstanding is",
        "the gateway's policy before this section existed (for KV: the score with no penalty).",
        shipped.describe(),
        "Stub engines: Python (`fleet_core.devtools.stub_engine`), as the Go stub models neither",
        "KV pressure nor a prefix cache. Load: from the bench's own process (aiohttp, closed",
        "loop), as the Go generator sends one fixed body and these clients vary prompt and tenant.",
        "",
        "KV-pressure avoidance (2 engines, one at 95% KV occupancy, 4 clients):",
        "",
        "| policy | share sent to the pressured engine | req/s | p50 | p99 |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {r['share']:.0%} | {r['rps']:.0f} | {r['p50']:.1f} | {r['p99']:.1f} |"
        for name, r in kv.items()
    ]
    lines += [
        "",
        f"Prefix affinity (3 engines, each caching {CACHE_ENTRIES} prefixes; {CONCURRENCY} "
        "clients; 24 system prompts, one of them at 50% of the traffic):",
        "",
        "| policy | prefix-cache hit rate | req/s | p50 | p99 | requests per engine | peak in "
        f"flight on one engine (bound ⌈(1+ε)·{CONCURRENCY}/3⌉ = {bound:.0f}) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in prefix.items():
        shares = " / ".join(f"{s:.0%}" for s in reversed(r["shares"]))
        lines.append(
            f"| {name} | {r['hit_rate']:.0%} | {r['rps']:.0f} | {r['p50']:.1f} | {r['p99']:.1f} | "
            f"{shares} | {r['peak']:.0f} |"
        )
    lines += [
        "",
        "Fair queue (1 engine, 2 slots, 20 ms a request; tenant A queues 100 requests, then B",
        "sends 5):",
        "",
        "| A's requests served while B's 5 waited | B's longest wait | A's median wait |",
        "|---|---|---|",
        f"| {fair['a_before_b']} (arrival order: 98) | {fair['b_max']:.0f} ms | "
        f"{fair['a_p50']:.0f} ms |",
        "",
    ]
    return lines
