"""Which closed-loop load generator the benchmarks run, and running it for one cell.

The Go generator (``bench/loadgen``, standard library only, its own HTTP/1.1 client) is built
once into the per-user cache, keyed by a hash of its source
(``$XDG_CACHE_HOME/fleet/loadgen-<hash>/loadgen``), and used whenever ``go`` is on PATH: it needs
a fraction of the CPU the Python one does, which matters when the generator shares 2 cores with
the servers it measures. Without ``go`` (or with
``FLEET_BENCH_LOADGEN=python``) ``load.py`` (aiohttp) runs instead; every section that drives
load says which one ran (``describe``). Both take the same arguments and print the same JSON
line; the bearer key goes through the environment (``FLEET_BENCH_KEY``), never argv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import gobuild

__all__ = ["PREAMBLE", "Cell", "binary", "command", "describe", "run", "run_with_cpu"]

Cell = dict[str, float]
PREAMBLE = (
    "- The load generator is a Go program (`bench/loadgen`: its own minimal HTTP/1.1",
    "  client, every connection on one epoll loop, one core), built once into",
    "  `~/.cache/fleet/loadgen-<hash of its source>/`; without `go` the Python one",
    "  (`bench/load.py`, aiohttp) runs instead. Each section names the one it ran. Against",
    "  the Go stub (`python -m bench.generator URL`, 2026-12-01, load average 5-9) the Go one",
    "  spent 0.010-0.016 cores per 1,000 req/s (sequential, plain c=32/c=64, stream c=64), the",
    "  Python one 0.10-0.14; behind a gateway (1.5-2.3k req/s, where each request wakes it) the",
    "  Go one spent 34-48 us of CPU per request on its epoll loop against 48-72 with a goroutine",
    "  per connection (ADR 0002; medians of 5 rounds, load average 7-9).",
)
SOURCE = Path(__file__).resolve().parent / "loadgen"
ENV = {**os.environ, "PYTHONPATH": str(SOURCE.parents[1])}


def binary() -> Path | str:
    """The Go generator, built if missing; or why the Python one runs instead."""
    if os.environ.get("FLEET_BENCH_LOADGEN") == "python":
        return "FLEET_BENCH_LOADGEN=python"
    return gobuild.binary(SOURCE)


def command() -> list[str]:
    """The generator's command, before its URL CONCURRENCY SECONDS MODE arguments."""
    found = binary()
    if isinstance(found, Path):
        return [str(found)]
    return [sys.executable, "-m", "bench.load"]


def describe() -> str:
    """One sentence for a report: which generator ran, and why when it is the Python one."""
    found = binary()
    if isinstance(found, Path):
        return "Load generator: Go (`bench/loadgen`, its own HTTP/1.1 client, one epoll loop)."
    return f"Load generator: Python (`bench/load.py`, aiohttp), because {found}."


def run(url: str, cell: str, key: str | None, seconds: float) -> Cell:
    """One cell (``sequential``, ``first frame``, ``plain c=64`` …) against ``url``."""
    return _timed(command(), url, cell, key, seconds)[0]


def run_with_cpu(url: str, cell: str, key: str | None, seconds: float) -> tuple[Cell, float]:
    """``run``, and the CPU seconds (user + system) the generator spent, warm-up included."""
    return _timed(command(), url, cell, key, seconds)


def _timed(
    program: list[str], url: str, cell: str, key: str | None, seconds: float
) -> tuple[Cell, float]:
    """The cell's figures and the CPU seconds (user + system) the generator process used."""
    mode, _, conc = cell.partition(" c=")
    concurrency = int(conc) if conc else 1
    mode = {"sequential": "plain", "first frame": "first"}.get(mode, mode)
    env = {**ENV, "FLEET_BENCH_KEY": key or ""}
    args = [*program, url, str(concurrency), str(seconds), mode]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    with proc.stdout:
        out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, args, out)
    return json.loads(out), usage.ru_utime + usage.ru_stime


def compare(url: str, cells: tuple[str, ...], rounds: int, seconds: float) -> dict[str, Cell]:
    """Both generators against one server, in interleaved rounds: per generator and cell, the
    median requests/s, p50 ms and CPU cores per 1,000 requests/s (``python -m bench.generator
    URL [CELL ...]``)."""
    go = binary()
    if not isinstance(go, Path):
        raise SystemExit(f"bench.generator: no Go generator to compare ({go})")
    programs = {"go": [str(go)], "python": [sys.executable, "-m", "bench.load"]}
    samples: dict[str, list[Cell]] = {}
    for _ in range(rounds):
        for cell in cells:
            for name, program in programs.items():
                started = time.perf_counter()
                figures, cpu = _timed(program, url, cell, None, seconds)
                cores = cpu / (time.perf_counter() - started)
                samples.setdefault(f"{name} {cell}", []).append(
                    {**figures, "cores_per_1k_rps": cores / (figures["rps"] / 1000)}
                )
    return {
        name: {key: sorted(c[key] for c in runs)[len(runs) // 2] for key in runs[0]}
        for name, runs in samples.items()
    }


if __name__ == "__main__":
    target, *wanted = sys.argv[1:]
    chosen = tuple(wanted) or ("sequential", "plain c=32", "plain c=64", "stream c=64")
    print(json.dumps(compare(target, chosen, rounds=3, seconds=5.0), indent=1))
