"""Instructions per request (issue 21): the floor and database-mode ratios counted, not timed.

On this shared VM one process's CPU time per request drifts by half between rounds of the same
load (ADR 0004, session 11), so the throughput verdicts near a threshold flip from run to run.
What a process executes does not drift: this section runs each server under valgrind's
callgrind and divides the user-space instructions it executed while a cell ran by the requests
the stub engine received in that time (the Go stub's ``stub_requests_total``). The verdicts are
those of the gateway and database sections, stated in instructions:

- the floor: the aiohttp pass-through proxy's instructions per request >= 70% of the gateway's
  (no auth), at c=32 and c=64, plain and stream;
- database mode: the no-auth gateway's instructions per request >= 85% of database mode's
  (auth, Redis limits, rates and the ledger), plain and stream at c=64, for a tenant under
  three budget rules and for one under none.

Under callgrind a server runs some 25-40 times slower, so work done per second of wall time
would fall on that many times fewer requests than at full speed. Every gateway's periodic work
is slowed `SLOWDOWN` times to match: the settings' intervals through their environment variables
(catalog poll and budget refresh every 30 s, ledger batches every 6 s, metrics every 30 s: about
the requests per poll and per batch of the database section at full speed), and the admission's
own windows through ``bench.serve``'s ``FLEET_BENCH_STRETCH`` (settlements sharing a round trip,
lease top-ups and budget slack sized to recent consumption, idle sweeps). Unstretched, those
windows put some 30 times their share of round trips and tasks on each request here: 861k
against 794k instructions per request in environment mode, 958k against 903k in database mode
(plain c=64, ADR 0002, session 15). The section counts the Redis script calls per request both
ways (the shipped gateway, uninstrumented and unslowed, for a few seconds first) so that a
slowdown that no longer matches shows. Kernel time (system calls, the loopback) is not counted:
it is the same kind of work for every server, and the time-based sections include it.
Instructions are not time: a byte scan runs several to a cycle, the interpreter about one, and
valgrind replaces memchr and its kin with plain loops (ADR 0002, session 12). The time-based
rows are the targets' measure. These are a diagnostic, not a verdict on time: they say which of
two versions executes less, and they once moved opposite to the clock (ADR 0002, session 25:
a request without its watcher task ran 3% fewer instructions and lost 12% of its throughput).

``FLEET_BENCH_ONLY=instructions`` runs this section (``FLEET_BENCH_INSTRUCTIONS_S``, default 12,
sets the seconds counted per cell; ``FLEET_BENCH_INSTRUCTIONS_WARM_S``, default 4, the warm-up).
It needs ``valgrind`` (Debian's package) and ``go`` (for the Go stub's request count), and says
"skipped: ..." without them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from bench import database_bench, generator, stub
from bench.admission_bench import redis_url
from bench.gateway_bench import ENV, QUIET, load_average, process
from bench.ledger_bench import scratch_database
from fleet_testing.ports import free_port
from fleet_testing.waiting import until_answers

__all__ = ["report", "run"]

FLOOR, GATEWAY, DB_MODE = "aiohttp proxy (floor)", "fleet-gateway, no auth", "database mode"
RULELESS = "database mode, a tenant with no budget rule"
FLOOR_CELLS = ("plain c=32", "plain c=64", "stream c=32", "stream c=64")
DB_CELLS = ("plain c=64", "stream c=64")
WARM_S = float(os.environ.get("FLEET_BENCH_INSTRUCTIONS_WARM_S", "4"))
COUNTED_S = float(os.environ.get("FLEET_BENCH_INSTRUCTIONS_S", "12"))
SLOWDOWN = 30
"""About callgrind's slowdown of a gateway: what its periodic work is slowed by."""
SLOWED = {"FLEET_METRICS_FLUSH_S": f"{SLOWDOWN * 1.0:g}", "FLEET_BENCH_STRETCH": f"{SLOWDOWN}"}
"""Periodic work slowed by about callgrind's slowdown (the module's docstring): every gateway."""
SLOWED_DATABASE = {
    **SLOWED,
    "FLEET_CATALOG_POLL_S": f"{SLOWDOWN * 1.0:g}",
    "FLEET_BUDGET_REFRESH_S": f"{SLOWDOWN * 1.0:g}",
    "FLEET_LEDGER_FLUSH_S": f"{SLOWDOWN * 0.2:g}",
}
SCRIPTS = ("evalsha", "eval")
FULL_SPEED = "database mode, uninstrumented"
"""Not a row of instructions: its Redis script calls per request, beside the counted ones."""
Counts = dict[str, dict[str, dict[str, float]]]
"""target -> cell -> instructions, requests (and Redis script calls) counted while the cell ran."""


def missing() -> str:
    """Why this section cannot run here, or ""."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian: apt-get install valgrind)"
    found = stub.binary()
    if not isinstance(found, Path):
        return f"the Go stub, whose request count this section reads, is not built ({found})"
    return ""


@dataclass(frozen=True)
class Counted:
    """A server running under callgrind, instrumentation off until a cell is counted."""

    name: str
    url: str
    key: str | None
    pid: int
    out: Path


@contextlib.contextmanager
def _under_callgrind(
    name: str, args: list[str], key: str | None, env: dict[str, str], out: Path
) -> Iterator[Counted]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        *(a.replace("PORT", str(port)) for a in args),
    ]
    proc = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**ENV, **env}
    )
    try:
        until_answers(url + "/healthz", proc, within=300)
        yield Counted(name, url, key, proc.pid, out)
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def served(engine: str) -> int:
    """Generation requests the Go stub has received."""
    with urllib.request.urlopen(engine + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(r"^stub_requests_total (\d+)$", text, re.M)
    if found is None:
        raise SystemExit("bench: the stub's /metrics has no stub_requests_total")
    return int(found.group(1))


def dumped_total(path: Path) -> int:
    """The instructions in one callgrind dump: its ``totals:`` line (a dump's ``summary:``
    line, written before its costs, says 0)."""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"bench: {path} has no totals line")


def _callgrind(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _scripts(store: redis.Redis | None) -> int:
    """Script calls Redis has served: the gateway's only round trips (every command it sends
    is an ``EVALSHA``; what a script runs inside counts under its own name)."""
    if store is None:
        return 0
    stats = store.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in SCRIPTS)


def count(
    target: Counted,
    cell: str,
    engine: str,
    store: redis.Redis | None,
    seconds: tuple[float, float] = (WARM_S, COUNTED_S),
) -> dict[str, float]:
    """One cell against ``target``: warmed up uncounted, then counted from idle to idle, so
    every request the stub received in the window was wholly served inside it."""
    generator.run(target.url, cell, target.key, seconds[0])
    time.sleep(0.5)
    dumps = set(target.out.parent.glob(target.out.name + ".*"))
    requests, scripts = served(engine), _scripts(store)
    _callgrind(target.pid, "--instr=on")
    generator.run(target.url, cell, target.key, seconds[1])
    time.sleep(0.5)  # answers the generator left behind finish inside the window
    _callgrind(target.pid, "--instr=off")
    requests, scripts = served(engine) - requests, _scripts(store) - scripts
    _callgrind(target.pid, "--dump")
    fresh = set(target.out.parent.glob(target.out.name + ".*")) - dumps
    if len(fresh) != 1:
        raise SystemExit(f"bench: expected one new callgrind dump, found {sorted(fresh)}")
    path = fresh.pop()
    figures = {"instructions": float(dumped_total(path)), "requests": float(requests)}
    if store is not None:
        figures["redis_scripts"] = float(scripts)
    path.unlink()
    return figures


@dataclass(frozen=True)
class Stage:
    """What the counted gateways run against: Redis, a seeded database, the Go stub."""

    store_url: str
    tmp: Path
    engine: str
    gateway: list[str]
    """``bench.serve``'s arguments for a gateway on the default server (``PORT`` to fill)."""
    shipped: dict[str, str]
    """Database mode's environment as shipped, nothing slowed."""


@contextlib.contextmanager
def stage(prefix: str) -> Iterator[Stage]:
    """Redis, a seeded scratch database and the Go stub behind a gateway config, for as long as
    the context lasts; database mode's environment writes under ``prefix`` in Redis."""
    with contextlib.ExitStack() as stack:
        store_url = stack.enter_context(redis_url())
        database = stack.enter_context(scratch_database())
        database_bench.seed(database)
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        port = free_port()
        engine = f"http://127.0.0.1:{port}"
        stack.enter_context(process(stub.command(port, "bench"), engine + "/health"))
        config = tmp / "fleet.yaml"
        config.write_text(f"upstreams:\n  - id: bench\n    model: bench\n    base_url: {engine}\n")
        gateway = ["bench.serve", database_bench.default_server(), "gateway", "PORT", str(config)]
        shipped = {
            **QUIET,
            "FLEET_REDIS_URL": store_url,
            "FLEET_REDIS_PREFIX": prefix,
            "FLEET_DATABASE_URL": database,
            "FLEET_LEDGER_SPOOL": str(tmp / "spool.jsonl"),
        }
        yield Stage(store_url, tmp, engine, gateway, shipped)


def run() -> tuple[Counts, str, list[str]]:
    """Every target's cells, or ({}, "skipped: <why>", loads)."""
    loads = [load_average()]
    why = missing()
    if why:
        return {}, f"skipped: {why}", loads
    counts: Counts = {}
    with contextlib.ExitStack() as stack:
        found = stack.enter_context(stage("bench-instructions:"))
        engine, gateway, shipped = found.engine, found.gateway, found.shipped
        store = stack.enter_context(redis.Redis.from_url(found.store_url))
        database_mode = {**shipped, **SLOWED_DATABASE}
        plan = [
            (FLOOR, ["bench.aiohttp_proxy", "PORT", engine], None, {}, FLOOR_CELLS, None),
            (GATEWAY, gateway, None, {**QUIET, **SLOWED}, FLOOR_CELLS, None),
            (DB_MODE, gateway, database_bench.SECRET, database_mode, DB_CELLS, store),
            (RULELESS, gateway, database_bench.RULELESS_SECRET, database_mode, DB_CELLS, store),
        ]
        full_speed = _scripts_at_full_speed(gateway, shipped, engine, store)
        for index, (name, args, key, env, cells, redis_store) in enumerate(plan):
            out = found.tmp / f"callgrind.{index}"
            with _under_callgrind(name, args, key, env, out) as target:
                for cell in cells:
                    counts.setdefault(name, {})[cell] = count(target, cell, engine, redis_store)
                    print(f"bench: instructions, {name}, {cell} counted", file=sys.stderr)
            loads.append(load_average())
    counts[FULL_SPEED] = full_speed
    return counts, "", loads


def _scripts_at_full_speed(
    args: list[str], env: dict[str, str], engine: str, store: redis.Redis
) -> dict[str, dict[str, float]]:
    """Database mode's Redis script calls per request without callgrind, as shipped (nothing
    slowed): the figure the instrumented one is compared with."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", *(a.replace("PORT", str(port)) for a in args)]
    found: dict[str, dict[str, float]] = {}
    with process(command, url + "/healthz", env):
        for cell in DB_CELLS:
            generator.run(url, cell, database_bench.SECRET, WARM_S)
            requests, scripts = served(engine), _scripts(store)
            generator.run(url, cell, database_bench.SECRET, WARM_S)
            requests, scripts = served(engine) - requests, _scripts(store) - scripts
            found[cell] = {"requests": float(requests), "redis_scripts": float(scripts)}
    return found


def per_request(figures: dict[str, float], key: str = "instructions") -> float:
    return figures[key] / figures["requests"] if figures["requests"] else float("nan")


def report(result: tuple[Counts, str, list[str]]) -> list[str]:
    counts, state, loads = result
    lines = ["## Instructions per request (issue 21)", ""]
    if state:
        return [*lines, f"Instructions per request: {state}.", ""]
    cells = FLOOR_CELLS
    lines += [
        "User-space instructions each server executed per request under valgrind's callgrind",
        "(`e2e/bench/instructions_bench.py`): the same count run after run, where CPU time on",
        "this VM is not. Each cell: a warm-up, then",
        f"{COUNTED_S:g} s counted from idle to idle, divided by the requests the Go stub received.",
        f"Periodic work is slowed {SLOWDOWN} times, about callgrind's slowdown:",
        f"{', '.join(f'`{k}={v}`' for k, v in SLOWED_DATABASE.items())}",
        "(the last stretches the admission's own windows: settlements sharing a round trip,",
        "lease top-ups and budget slack sized to recent use, idle sweeps; `bench.serve`).",
        "Redis script calls per request below, counted and uninstrumented as shipped, show",
        "whether that slowdown matches. A diagnostic beside the timed sections, which are",
        "the targets' measure: count and clock once moved in opposite directions",
        "(ADR 0002, session 25).",
        generator.describe(),
        f"Machine load: {'; '.join(loads)}.",
        "",
        "| server | " + " | ".join(cells) + " |",
        "|---|" + "---|" * len(cells),
    ]
    for name, measured in counts.items():
        if name == FULL_SPEED:
            continue
        row = [
            f"{per_request(measured[c]) / 1000:,.0f}k ({measured[c]['requests']:.0f} requests)"
            if c in measured
            else ""
            for c in cells
        ]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    redis_rows = [
        f"{cell}: {per_request(figures, 'redis_scripts'):.3f} counted, "
        f"{per_request(counts[FULL_SPEED][cell], 'redis_scripts'):.3f} uninstrumented"
        for cell, figures in counts[DB_MODE].items()
    ]
    lines += [
        "",
        f"Redis script calls per request, database mode: {'; '.join(redis_rows)}.",
        "",
        "| target (by instructions) | measured | verdict |",
        "|---|---|---|",
    ]
    for cell in FLOOR_CELLS:
        share = per_request(counts[FLOOR][cell]) / per_request(counts[GATEWAY][cell])
        lines.append(
            f"| floor / gateway, {cell} >= 70% | {share:.0%} | {_verdict(share >= 0.70)} |"
        )
    for name, which in ((DB_MODE, "three budget rules"), (RULELESS, "no budget rule")):
        for cell in DB_CELLS if name in counts else ():
            share = per_request(counts[GATEWAY][cell]) / per_request(counts[name][cell])
            lines.append(
                f"| no auth / database mode ({which}), {cell} >= 85% | {share:.0%} | "
                f"{_verdict(share >= 0.85)} |"
            )
    return [*lines, ""]


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"
