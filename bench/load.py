"""A closed-loop load generator in its own process: N workers, fixed duration, latencies.

Usage: python -m bench.load URL CONCURRENCY SECONDS plain|stream|first -> one JSON line.
``plain`` and ``stream`` time whole responses; ``first`` times a stream's first SSE frame. The
bearer key, if any, comes from ``FLEET_BENCH_KEY``. The benchmarks run the Go generator
(``loadgen/``, same arguments and output) when ``go`` is there; this one is the fallback
(``bench.generator``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import aiohttp
import uvloop

BODY = {
    "model": "bench",
    "messages": [{"role": "user", "content": "benchmark me"}],
    "max_tokens": 16,
}


async def worker(
    session: aiohttp.ClientSession,
    url: str,
    mode: str,
    until: float,
    latencies: list[float],
    errors: list[int],
    key: str | None = None,
) -> None:
    body = json.dumps({**BODY, "stream": mode != "plain"}).encode()
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    while time.perf_counter() < until:
        start = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as resp:
            first = start
            if mode == "first":
                await resp.content.readuntil(b"\n\n")
                first = time.perf_counter()
            await resp.read()
            if resp.status != 200:
                errors.append(resp.status)
                continue
        latencies.append((first if mode == "first" else time.perf_counter()) - start)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def main(
    base: str, concurrency: int, seconds: float, mode: str, key: str | None = None
) -> dict[str, float]:
    url = base + "/v1/chat/completions"
    latencies: list[float] = []
    errors: list[int] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        warm_until = time.perf_counter() + min(1.0, seconds / 4)
        await asyncio.gather(
            *(worker(session, url, mode, warm_until, [], [], key) for _ in range(concurrency))
        )
        start = time.perf_counter()
        until = start + seconds
        await asyncio.gather(
            *(worker(session, url, mode, until, latencies, errors, key) for _ in range(concurrency))
        )
        elapsed = time.perf_counter() - start
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "requests": len(latencies),
        "errors": len(errors),
    }


if __name__ == "__main__":
    url, conc, secs, mode = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    key = os.environ.get("FLEET_BENCH_KEY") or None
    print(json.dumps(uvloop.run(main(url, conc, secs, mode, key))))
