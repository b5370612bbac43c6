"""Admission cost: the gateway with keys and Redis limits on versus off, and the
limiter alone versus ``redis-benchmark`` sending the same EVALSHA to the same server.

"Limits on" is the shipped default, leased buckets (ADR 0016: each gateway process admits from
its own slice of each Redis bucket); "limits on, exact" is ``FLEET_RATE_LEASE=off``, one batched
script call per admission and per settlement window, the baseline the leases are judged against
in the same run.

Targets: limits cost at most 15% of throughput and 1 ms at p50; the limiter's admissions/s come
close to what Redis itself sustains for that script (the remainder is the Python client).

Every gateway is ``fleet-gateway`` as shipped (``shipped``: one worker, its default server), in
front of the gateway section's stub engine (``stub``: Go, or Python without ``go``), under the
Go load generator (``generator``); the section names each one that ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import redis
import uvloop

from bench import generator, shipped, stub
from bench.gateway_bench import (
    ROUNDS,
    SECONDS,
    Cell,
    added,
    load,
    median,
    process,
    rotated,
    summary,
)
from fleet_core.gateway.admission.limits import Bucket, Charge
from fleet_core.gateway.admission.store import open_redis_store, script_source
from fleet_testing import servers
from fleet_testing.ports import free_port

KEY = "acme/research/bench"
LIMITS_ON = {
    "FLEET_AUTH_REQUIRED": "true",
    "FLEET_API_KEYS": KEY,
    "FLEET_RATE_TENANTS": "acme|rpm=100000000,tpm=100000000000",
    "FLEET_RATE_PROJECTS": "acme/research|rpm=100000000,tpm=100000000000",
}
CELLS = ("sequential", "plain c=64")


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    """A Redis URL: ``FLEET_BENCH_REDIS_URL``, else one found or started."""
    with servers.redis(os.environ, variable="FLEET_BENCH_REDIS_URL") as server:
        yield server.url


@contextlib.contextmanager
def gateways(url: str) -> Iterator[tuple[str, str, str, str]]:
    engine, off, on, exact, memory = (free_port() for _ in range(5))
    direct = f"http://127.0.0.1:{engine}"
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        fleet_yaml = tmp / "fleet.yaml"
        fleet_yaml.write_text(
            f"upstreams:\n  - id: bench\n    model: bench\n    base_url: {direct}\n"
        )
        stack.enter_context(process(stub.command(engine, "bench"), direct + "/health"))

        def gateway(port: int, env: dict[str, str]) -> str:
            url = f"http://127.0.0.1:{port}"
            command = shipped.command(fleet_yaml, port)
            stack.enter_context(process(command, url + "/healthz", {**shipped.ENV, **env}))
            return url

        redis_env = {**LIMITS_ON, "FLEET_REDIS_URL": url, "FLEET_REDIS_PREFIX": "bench:"}
        exact_env = {**redis_env, "FLEET_REDIS_PREFIX": "bench-exact:", "FLEET_RATE_LEASE": "off"}
        yield (
            gateway(off, {}),
            gateway(on, redis_env),
            gateway(exact, exact_env),
            gateway(memory, LIMITS_ON),
        )


def buckets(prefix: str) -> list[Bucket]:
    tag = f"{prefix}{{acme}}"
    return [
        Bucket(f"{tag}:rpm", "tenant", "rpm", 10**9),
        Bucket(f"{tag}:tpm", "tenant", "tpm", 10**12),
    ]


async def limiter_alone(url: str, seconds: float, concurrency: int = 64) -> float:
    store = await open_redis_store(url, timeout_s=5)
    bs = buckets("bench:alone:")
    charges = [Charge(bs[0], 1), Charge(bs[1], 100)]
    done = 0

    async def worker(until: float) -> None:
        nonlocal done
        while time.perf_counter() < until:
            await store.reserve(charges)
            done += 1

    await worker(time.perf_counter() + 0.2)
    done = 0
    start = time.perf_counter()
    await asyncio.gather(*(worker(start + seconds) for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    await store.aclose()
    return done / elapsed


def redis_benchmark(url: str, requests: int = 200_000) -> float | None:
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return None
    sha = redis.Redis.from_url(url).script_load(script_source("admit.lua"))
    parts = urlsplit(url)
    bs = buckets("bench:rb:")
    args = [
        binary,
        "-h",
        parts.hostname or "127.0.0.1",
        "-p",
        str(parts.port or 6379),
        "-c",
        "64",
        "-n",
        str(requests),
        "--csv",
        "EVALSHA",
        sha,
        "2",
        bs[0].key,
        bs[1].key,
        # capacities, then one reservation of two pairs (bucket index, amount), then 0 budget
        # rules: see admit.lua
        str(bs[0].capacity),
        str(bs[1].capacity),
        "1",
        "2",
        "1",
        "1",
        "2",
        "100",
        "0",
    ]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    last = [line for line in out.splitlines() if line.startswith('"')][-1]
    return float(last.split(",")[1].strip('"'))


def run() -> dict[str, object]:
    samples: dict[str, dict[str, list[Cell]]] = {}
    with redis_url() as url:
        with gateways(url) as (off, on, exact, memory):
            targets = (
                ("limits off", off, None),
                ("limits on", on, KEY),
                ("limits on, exact (FLEET_RATE_LEASE=off)", exact, KEY),
                ("limits on, memory store", memory, KEY),
            )
            for round_ in range(ROUNDS):
                for cell in CELLS:
                    for name, target, key in rotated(targets, round_):
                        samples.setdefault(name, {}).setdefault(cell, []).append(
                            load(target, cell, key)
                        )
                print(f"bench: admission round {round_ + 1} of {ROUNDS} done", file=sys.stderr)
        alone = [uvloop.run(limiter_alone(url, SECONDS)) for _ in range(ROUNDS)]
        native = [redis_benchmark(url) for _ in range(ROUNDS)]
    return {"samples": samples, "alone": alone, "native": native}


def report(result: dict[str, object]) -> list[str]:
    samples = result["samples"]
    assert isinstance(samples, dict)
    medians = {
        name: {cell: summary(runs) for cell, runs in cells.items()}
        for name, cells in samples.items()
    }

    def ratio_to_off(name: str) -> float:
        pairs = zip(samples[name]["plain c=64"], samples["limits off"]["plain c=64"], strict=True)
        return median([on["rps"] / off["rps"] for on, off in pairs])

    ratio = ratio_to_off("limits on")
    p50_64 = added(samples, "limits on", "limits off", "plain c=64")
    p50_seq = added(samples, "limits on", "limits off", "sequential")
    lines = [
        "## Admission cost",
        "",
        "The gateway against the stub engine, with keys and tenant + project limits in Redis",
        f"(4 buckets per request) versus auth and limits off; medians of {ROUNDS} interleaved",
        "rounds. Limits on: leased buckets, the default (ADR 0016: admitted from this process's",
        "slice of each bucket, slices topped up in the background); exact: one batched EVALSHA",
        "per admission and per settlement window (`FLEET_RATE_LEASE=off`).",
        shipped.describe(),
        stub.describe(),
        generator.describe(),
        "",
        "| gateway | sequential req/s / p50 / p99 | plain c=64 req/s / p50 / p99 |",
        "|---|---|---|",
    ]
    for name, cells in medians.items():
        row = " | ".join(
            f"{cells[c]['rps']:.0f} / {cells[c]['p50_ms']:.2f} / {cells[c]['p99_ms']:.2f}"
            for c in CELLS
        )
        lines.append(f"| {name} | {row} |")
    lines += [
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| throughput with limits >= 85% of without, c=64 | {ratio:.0%} | "
        f"{'met' if ratio >= 0.85 else 'NOT met'} |",
        f"| added p50 <= 1 ms, sequential | {p50_seq:.2f} ms | "
        f"{'met' if p50_seq <= 1 else 'NOT met'} |",
        f"| added p50 at c=64 (for reference) | {p50_64:.2f} ms | |",
        f"| the exact path (`FLEET_RATE_LEASE=off`), c=64 (for reference) | "
        f"{ratio_to_off('limits on, exact (FLEET_RATE_LEASE=off)'):.0%} | |",
        f"| same limits in process memory, c=64 (for reference) | "
        f"{ratio_to_off('limits on, memory store'):.0%} | |",
    ]
    alone, native = result["alone"], result["native"]
    assert isinstance(alone, list)
    assert isinstance(native, list)
    lines += [
        "",
        "Limiter alone (RedisStore.reserve, 2 buckets, 64 concurrent callers in one "
        "Python process) versus `redis-benchmark -c 64` sending the same EVALSHA:",
        "",
        f"- limiter: {median(alone):.0f} admissions/s "
        f"(rounds: {', '.join(f'{a:.0f}' for a in alone)})",
    ]
    if all(n is not None for n in native):
        lines.append(
            f"- redis-benchmark: {median([float(n) for n in native]):.0f} calls/s "
            f"(rounds: {', '.join(f'{n:.0f}' for n in native)}); the limiter reaches "
            f"{median(alone) / median([float(n) for n in native]):.0%} of it"
        )
    else:
        lines.append("- redis-benchmark: not installed on this machine (Debian's redis-tools)")
    return [*lines, ""]
