"""Memory and growth: the gateway under a long mixed load must come back to where it was.

``FLEET_BENCH_ONLY=soak``: ``fleet-gateway`` as shipped (``shipped``: one worker, its default
server) in front of the gateway section's stub engine (``stub``: Go, or Python without ``go``),
its tokens paced 2 ms apart so that a stream lasts long enough to be left mid-way, takes
``FLEET_BENCH_SOAK_S`` seconds (default 1800) of bounded load on 16 connections from clients in
processes of their own: the Go load generator (``generator``) on 8 sending non-stream requests
and on 6 reading whole streams, and a client of this module on 2 leaving every stream after its
first frame (the Go generator has no such mode). Before and after, the load stops and the
gateway idles past the engine pool's keep-alive; then its RSS, open file descriptors, TCP
connections and the ``fleet_requests_in_flight`` gauge are read. Targets: RSS growth <= 10%, in
flight back to 0, descriptors and connections back to the baseline. RSS is also sampled during
the run, to show a trend rather than two points.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil  # type: ignore[import-untyped]
import uvloop

from bench import generator, shipped, stub
from bench.gateway_bench import ENV, load_average, process
from bench.report import verdict
from fleet_testing.ports import free_port

__all__ = ["report", "run"]

SOAK_S = float(os.environ.get("FLEET_BENCH_SOAK_S", "1800"))
WARM_S = min(60.0, SOAK_S / 10)
PLAIN, STREAM, LEAVING = 8, 6, 2
"""Connections: non-stream and whole streams (the Go generator), streams left (this module)."""
CONCURRENCY = PLAIN + STREAM + LEAVING
TOKEN_DELAY_MS = 2  # an 11-token stream lasts ~25 ms, so leaving after its first frame is mid-way
IDLE_S = 20.0  # past aiohttp's 15 s keep-alive for idle engine connections
BODY = {"model": "bench", "messages": [{"role": "user", "content": "soak"}], "max_tokens": 16}


@dataclass(frozen=True)
class Soak:
    before: dict[str, float]
    after: dict[str, float]
    counts: dict[str, int]
    trend: list[float]
    elapsed_s: float
    load: str


def _state(proc: psutil.Process, url: str) -> dict[str, float]:
    """RSS, descriptors and connections first, then the gauge: the ``/metrics`` request's own
    connection must not be counted (the server may not have closed it yet when counting)."""
    state = {
        "rss_mb": proc.memory_info().rss / 2**20,
        "fds": proc.num_fds(),
        "tcp": len(proc.net_connections(kind="tcp")),
    }
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    state["in_flight"] = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("fleet_requests_in_flight")
    )
    return state


def _drive(url: str, seconds: float, samples: list[float], proc: psutil.Process) -> dict[str, int]:
    """Run the load clients for ``seconds``, sampling RSS every ~30 s; their counts."""
    span = str(seconds)
    clients = [
        _client_process([*generator.command(), url, str(PLAIN), span, "plain"]),
        _client_process([*generator.command(), url, str(STREAM), span, "stream"]),
        _client_process([sys.executable, "-m", "bench.soak_bench", url, str(LEAVING), span]),
    ]
    while any(c.poll() is None for c in clients):
        samples.append(proc.memory_info().rss / 2**20)
        with contextlib.suppress(subprocess.TimeoutExpired):
            next(c for c in clients if c.poll() is None).wait(timeout=_sample_every(seconds))
    plain, streams, leaving = (_counts(c) for c in clients)
    return {
        "ok": int(plain["requests"] + streams["requests"]),
        "left": int(leaving["left"]),
        "errors": int(plain["errors"] + streams["errors"] + leaving["errors"]),
    }


def _sample_every(seconds: float) -> float:
    return min(30.0, max(1.0, seconds / 20))


def _client_process(args: list[str]) -> subprocess.Popen[str]:
    """A load client; the generator's bearer key is empty (auth is off)."""
    env = {**ENV, **generator.ENV, "FLEET_BENCH_KEY": ""}
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)


def _counts(client: subprocess.Popen[str]) -> dict[str, float]:
    assert client.stdout is not None
    with client.stdout:
        out = client.stdout.read()
    if client.wait() != 0:
        raise SystemExit(f"bench: a soak client failed ({client.args!r})")
    return json.loads(out)  # type: ignore[no-any-return]


def _engine(port: int) -> tuple[list[str], dict[str, str]]:
    """The stub engine's command and environment, its tokens paced ``TOKEN_DELAY_MS`` apart."""
    found = stub.binary()
    if isinstance(found, Path):
        return [str(found), str(port), "bench"], {"FLEET_STUB_TOKEN_DELAY_MS": str(TOKEN_DELAY_MS)}
    command = stub.python_command(port, "bench")
    return [*command, "--token-delay-ms", str(TOKEN_DELAY_MS)], {}


def run() -> Soak:
    engine = free_port()
    direct = f"http://127.0.0.1:{engine}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        config = Path(tmp) / "fleet.yaml"
        config.write_text(f"upstreams:\n  - id: bench\n    model: bench\n    base_url: {direct}\n")
        engine_command, engine_env = _engine(engine)
        stack.enter_context(process(engine_command, direct + "/health", engine_env))
        stack.enter_context(process(shipped.command(config, port), url + "/healthz", shipped.ENV))
        proc = _gateway_process(port)
        trend: list[float] = []
        _drive(url, WARM_S, [], proc)
        time.sleep(IDLE_S)
        before = _state(proc, url)
        started = time.monotonic()
        counts = _drive(url, SOAK_S, trend, proc)
        elapsed = time.monotonic() - started
        time.sleep(IDLE_S)
        after = _state(proc, url)
    return Soak(before, after, counts, trend, elapsed, load_average())


def _gateway_process(port: int) -> psutil.Process:
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    raise SystemExit(f"bench: no process listens on port {port}")


def report(result: Soak) -> list[str]:
    before, after, counts = result.before, result.after, result.counts
    growth = after["rss_mb"] / before["rss_mb"] - 1
    minutes = result.elapsed_s / 60
    short = " (shortened with FLEET_BENCH_SOAK_S: not the 30-minute soak)" if SOAK_S < 1800 else ""
    points = ", ".join(f"{mb:.1f}" for mb in _spread(result.trend, 8))
    return [
        "## Soak: memory and growth",
        "",
        f"fleet-gateway under {minutes:.1f} minutes of mixed load{short}:",
        f"{CONCURRENCY} connections; {PLAIN} sending non-stream requests and {STREAM} reading "
        "whole streams",
        f"(the load generator), {LEAVING} leaving every stream after its first frame (a Python",
        f"client: the Go generator has no such mode). {counts['ok']} requests answered,",
        f"{counts['left']} streams left mid-way, {counts['errors']} errors. {result.load} at the",
        f"end. Before and after: the load stopped and the gateway idle for {IDLE_S:.0f} s.",
        shipped.describe(),
        f"{stub.describe()} Its tokens {TOKEN_DELAY_MS} ms apart, so a stream lasts ~25 ms.",
        generator.describe(),
        "",
        "| measure | before | after | target | verdict |",
        "|---|---|---|---|---|",
        f"| RSS | {before['rss_mb']:.1f} MB | {after['rss_mb']:.1f} MB ({growth:+.1%}) | "
        f"<= +10% | {verdict(growth <= 0.10)} |",
        f"| requests in flight | {before['in_flight']:.0f} | {after['in_flight']:.0f} | 0 | "
        f"{verdict(after['in_flight'] == 0)} |",
        f"| open file descriptors | {before['fds']:.0f} | {after['fds']:.0f} | baseline | "
        f"{verdict(after['fds'] <= before['fds'])} |",
        f"| TCP connections | {before['tcp']:.0f} | {after['tcp']:.0f} | baseline | "
        f"{verdict(after['tcp'] <= before['tcp'])} |",
        "",
        f"RSS during the run (MB, evenly spaced samples): {points}.",
        "",
    ]


def _spread(values: list[float], count: int) -> list[float]:
    if len(values) <= count:
        return values
    step = (len(values) - 1) / (count - 1)
    return [values[round(i * step)] for i in range(count)]


async def _client(url: str, concurrency: int, seconds: float) -> dict[str, int]:
    """``concurrency`` connections, each asking for a stream and leaving it after its first
    frame, again and again for ``seconds``."""
    counts = {"left": 0, "errors": 0}
    until = time.monotonic() + seconds

    async def one(session: aiohttp.ClientSession) -> None:
        body = {**BODY, "stream": True}
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                counts["errors"] += 1
                await resp.read()
            else:
                await resp.content.readuntil(b"\n\n")
                resp.close()  # leave mid-stream: the connection is dropped, not reused
                counts["left"] += 1

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < until:
            try:
                await one(session)
            except aiohttp.ClientError:
                counts["errors"] += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return counts


if __name__ == "__main__":
    target, conc, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    print(json.dumps(uvloop.run(_client(target, conc, secs))))
