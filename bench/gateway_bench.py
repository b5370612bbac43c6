"""Gateway overhead against honest baselines: the floor, the ASGI servers, more workers, LiteLLM.

Every process is separate (engine, proxies, gateways, load generator) and all share this machine's
cores, so absolute numbers are noisy; the ratios within one run, taken round by round over
interleaved rounds, are what the targets judge. Every round starts the targets afresh
(all but the stub engine and LiteLLM): two processes of one server differ steadily by up to a
tenth, which rounds of one process each could never average out (ADR 0002).

- the floor is a pass-through proxy on aiohttp's own server and client (``aiohttp_proxy.py``):
  gateway throughput >= 70% of it at c=32 and c=64, plain and stream. The Starlette bare proxy on
  each ASGI server stays as a row, to show what the server alone costs;
- LiteLLM's proxy (``litellm_peer.py``, one worker, its own venv): gateway throughput >= 20x, and
  the gateway's added sequential p50 <= 1/10 of LiteLLM's;
- ``fleet-gateway --workers 2`` on 2 cores (the load generator sharing them): >= 1.4x one worker.
  Throughput on a shared machine is mostly a share of the scheduler, so for these two rows the
  bench also records the CPU each process spent per request (the gateway's processes, the stub,
  the generator) and reports what the cores allow: one worker is held to one core, two workers
  share both with the stub and the generator, so the ratio cannot pass 2 x one / (two + stub +
  generator) in CPU per request (ADR 0002). That ratio sits about a tenth above its
  target and a round of it spreads by more (one process's luck on each side), so after the
  section's rounds come ``WORKER_ROUNDS`` more, with every target started as before but only
  these two measured: the verdict is the median of all of them (ADR 0002).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import psutil  # type: ignore[import-untyped]

from bench import generator, litellm_peer, stub
from bench.report import verdict
from fleet_testing.ports import free_port
from fleet_testing.waiting import until_answers

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
SECONDS = float(os.environ.get("FLEET_BENCH_SECONDS", "3"))
ROUNDS = int(os.environ.get("FLEET_BENCH_ROUNDS", "5"))
WORKER_ROUNDS = int(os.environ.get("FLEET_BENCH_WORKER_ROUNDS", "6"))
"""Rounds beyond ``ROUNDS`` that measure only one worker and ``--workers 2``."""
SERVERS = ("uvicorn", "hypercorn", "granian")
DEFAULT_SERVER = "uvicorn"
"""What ``fleet-gateway`` runs on unless ``--server`` says otherwise: the row the targets judge."""
FULL = ("sequential", "first frame", "plain c=32", "plain c=64", "stream c=32", "stream c=64")
SHORT = ("sequential", "plain c=64", "stream c=64")
PEER = ("sequential", "plain c=32", "stream c=32")
THROUGHPUT = ("plain c=32", "plain c=64", "stream c=32", "stream c=64")
Cell = dict[str, float]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "e2e")])}
"""For the bench's own processes: ``bench`` and ``fleet_testing`` importable."""
FLOOR = "aiohttp proxy (floor)"
GATEWAY = f"fleet-gateway ({DEFAULT_SERVER})"
BARE = f"bare proxy ({DEFAULT_SERVER})"
WORKERS = "fleet-gateway --workers 2"
LITELLM = f"LiteLLM proxy {litellm_peer.VERSION}"
QUIET = {"FLEET_ACCESS_LOG": "false"}


@contextlib.contextmanager
def process(
    args: list[str], health: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**ENV, **(env or {})}
    )
    try:
        until_answers(health, proc, within=120)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def load(url: str, cell: str, key: str | None = None, seconds: float = SECONDS) -> Cell:
    return generator.run(url, cell, key, seconds)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and of its children (a supervisor's workers)."""
    parent = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [parent, *parent.children()])


def load_with_cpu(url: str, cell: str, server: int, engine: int) -> Cell:
    """``load``, plus the microseconds of CPU per request spent by the server under test (with
    its workers), the engine and the generator. The generator's run includes its warm-up, so
    the requests counted are its rate times the whole run's wall time."""
    before = (_cpu_s(server), _cpu_s(engine))
    started = time.perf_counter()
    figures, generator_s = generator.run_with_cpu(url, cell, None, SECONDS)
    requests = figures["rps"] * (time.perf_counter() - started)
    spent = (_cpu_s(server) - before[0], _cpu_s(engine) - before[1], generator_s)
    if requests <= 0:
        return figures
    server_us, engine_us, generator_us = (1e6 * x / requests for x in spent)
    return {**figures, "cpu_us": server_us, "engine_us": engine_us, "generator_us": generator_us}


def _python(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


Pids = dict[str, int]
"""The processes whose CPU the bench reads: the engine and the rows in `CPU_ROWS`."""
ENGINE = "engine"
CPU_ROWS = (FLOOR, GATEWAY, WORKERS)


@contextlib.contextmanager
def engine_and_peer() -> Iterator[tuple[str, Path, int, str]]:
    """What every round shares: the stub engine (its URL and pid), the gateways' config naming
    it, and LiteLLM, its URL when it runs, else "skipped: <why>"."""
    engine = free_port()
    direct = f"http://127.0.0.1:{engine}"
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        config = Path(tmp) / "fleet.yaml"
        config.write_text(f"upstreams:\n  - id: bench\n    model: bench\n    base_url: {direct}\n")
        pid = stack.enter_context(process(stub.command(engine, "bench"), direct + "/health")).pid
        yield direct, config, pid, _start_litellm(stack, direct, Path(tmp))


@contextlib.contextmanager
def targets(direct: str, config: Path) -> Iterator[tuple[dict[str, str], Pids]]:
    """The floor, the bare proxies, the gateways and ``--workers 2`` in front of the engine:
    (name -> URL, name -> pid). Started afresh every round: two processes of the same server
    differ steadily by up to a tenth in throughput (ADR 0002), so one process per
    target for the whole run would put one draw of that luck into every round's ratio."""
    urls: dict[str, str] = {}
    pids: Pids = {}
    with contextlib.ExitStack() as stack:

        def serve(name: str, *args: str, env: dict[str, str] | None = None) -> None:
            """Start ``python -m *args``, PORT in ``args`` replaced by a free port."""
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            command = _python(*(a.replace("PORT", str(port)) for a in args))
            pids[name] = stack.enter_context(process(command, url + "/healthz", env)).pid
            urls[name] = url

        serve(FLOOR, "bench.aiohttp_proxy", "PORT", direct)
        for server in SERVERS:
            serve(f"bare proxy ({server})", "bench.serve", server, "bare", "PORT", direct)
            gateway = ("bench.serve", server, "gateway", "PORT", str(config))
            serve(f"fleet-gateway ({server})", *gateway)
        workers = ("fleet_core.gateway", "--config", str(config), "--workers", "2")
        # as the one-worker row runs: no access line per request (bench.serve logs warnings only)
        serve(WORKERS, *workers, "--listen", "127.0.0.1:PORT", env=QUIET)
        time.sleep(0.5)
        yield urls, pids


def _start_litellm(stack: contextlib.ExitStack, direct: str, tmp: Path) -> str:
    """LiteLLM's URL once it answers, or "skipped: <why>"."""
    program = litellm_peer.install()
    if isinstance(program, str):
        return f"skipped: {program}"
    config = tmp / "litellm.yaml"
    config.write_text(litellm_peer.config(direct))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        stack.enter_context(
            process(
                litellm_peer.command(program, config, port),
                url + "/health/liveliness",
                litellm_peer.environment(),
            )
        )
    except SystemExit as exc:
        return f"skipped: LiteLLM did not start ({exc})"
    return url


Samples = dict[str, dict[str, list[Cell]]]


def _cells(name: str) -> tuple[str, ...]:
    if name == LITELLM:
        return PEER
    if any(f"({server})" in name for server in SERVERS if server != DEFAULT_SERVER):
        return SHORT
    return FULL


def rotated(items: Sequence[T], round_: int) -> list[T]:
    """``items`` starting at the ``round_``-th, wrapping: over as many rounds as targets, each
    target is measured in every place once, so none always follows the same other (a target
    whose load outlives its cell, Postgres vacuuming a gateway's ledger rows say, would else
    always slow the same next one)."""
    start = round_ % len(items) if items else 0
    return [*items[start:], *items[:start]]


Result = tuple[Samples, Samples, str, list[str]]
"""What a run gives the report: every target's rounds; the workers rows' rounds (the section's
and ``WORKER_ROUNDS`` more); LiteLLM's "skipped: ..." or ""; the load after each round."""


def run() -> Result:
    """Every cell of every target, ``ROUNDS`` times, interleaved so that drift on the machine
    falls on all targets alike; ratios are then taken round by round. Within a round each cell
    is measured on every target in turn, so the two sides of a ratio are seconds apart rather
    than the other targets' whole runs (minutes, over which this machine's speed moves). Then
    ``WORKER_ROUNDS`` rounds of one worker and ``--workers 2`` alone, every target started as in
    the others so that the cores hold the same idle processes."""
    samples: Samples = {}
    scaling: Samples = {}
    loads = [load_average()]
    with engine_and_peer() as (direct, config, engine, peer):
        litellm = "" if peer.startswith("http") else peer
        for round_ in range(ROUNDS + WORKER_ROUNDS):
            with targets(direct, config) as (started, pids):
                urls = {"direct": direct, **started, **({LITELLM: peer} if not litellm else {})}
                pids[ENGINE] = engine
                if round_ >= ROUNDS:
                    urls = {name: urls[name] for name in (GATEWAY, WORKERS)}
                for cell in FULL if round_ < ROUNDS else THROUGHPUT:
                    for name in rotated([n for n in urls if cell in _cells(n)], round_):
                        figures = _measure(name, urls[name], cell, pids)
                        if round_ < ROUNDS:
                            samples.setdefault(name, {}).setdefault(cell, []).append(figures)
                        if name in (GATEWAY, WORKERS) and cell in THROUGHPUT:
                            scaling.setdefault(name, {}).setdefault(cell, []).append(figures)
            loads.append(load_average())
            total = ROUNDS + WORKER_ROUNDS
            print(f"bench: round {round_ + 1} of {total} done ({loads[-1]})", file=sys.stderr)
    return samples, scaling, litellm, loads


def _measure(name: str, url: str, cell: str, pids: Pids) -> Cell:
    """One cell on one target, with the CPU per request of each process where a table reads it."""
    if name in CPU_ROWS and cell in THROUGHPUT:
        return load_with_cpu(url, cell, pids[name], pids[ENGINE])
    return load(url, cell, litellm_peer.KEY if name == LITELLM else None)


def load_average() -> str:
    """The machine's 1-minute load average: how shared the cores were during a run."""
    with contextlib.suppress(OSError):
        return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    return "load average unknown"


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def summary(cells: list[Cell]) -> Cell:
    return {key: median([c[key] for c in cells]) for key in cells[0]}


def ratio(samples: Samples, a: str, b: str, cell: str, key: str = "rps") -> float:
    return median(ratios(samples, a, b, cell, key))


def ratios(samples: Samples, a: str, b: str, cell: str, key: str = "rps") -> list[float]:
    """``a / b`` round by round."""
    return [x[key] / y[key] for x, y in zip(samples[a][cell], samples[b][cell], strict=True)]


def spread(values: list[float]) -> str:
    """The lowest and the highest round's ratio: how far the rounds behind a median spread."""
    return f"rounds {min(values):.0%}-{max(values):.0%}" if values else "no round measured"


def added(samples: Samples, a: str, b: str, cell: str) -> float:
    pairs = zip(samples[a][cell], samples[b][cell], strict=True)
    return median([x["p50_ms"] - y["p50_ms"] for x, y in pairs])


def _row(name: str, cells: dict[str, Cell], columns: tuple[str, ...]) -> str:
    parts = [
        f"{cells[c]['rps']:.0f} / {cells[c]['p50_ms']:.2f} / {cells[c]['p99_ms']:.2f}"
        if c in cells
        else ""
        for c in columns
    ]
    return f"| {name} | " + " | ".join(parts) + " |"


def report(result: Result) -> list[str]:
    samples, scaling, litellm, loads = result
    medians = {
        name: {cell: summary(runs) for cell, runs in cells.items()}
        for name, cells in samples.items()
    }
    lines = [
        "## Gateway overhead",
        "",
        f"Each cell: requests/s / p50 ms / p99 ms, the median of {ROUNDS} interleaved rounds;",
        "every target but the engine and LiteLLM is started afresh each round (two processes",
        "of one server differ steadily by up to a tenth: ADR 0002).",
        f"Machine load before and after each round: {'; '.join(loads)} (other work shares the",
        "cores: high load makes every figure noisy). `sequential` is one client, non-stream;",
        "`first frame` is one client timing a stream's first SSE frame. Ratios and differences",
        "are taken round by round, then the median is reported. The floor is a pass-through",
        "proxy on aiohttp's own server and client; the bare proxies are Starlette + aiohttp on",
        f"each ASGI server. The targets judge `fleet-gateway ({DEFAULT_SERVER})`, the shipped",
        "default (uvicorn with httptools, ADR 0002). LiteLLM: its proxy, one worker,",
        f"`litellm[proxy]=={litellm_peer.VERSION}` in a venv of its own. `per CPU second`",
        "beside a floor ratio is the floor's CPU time per request over the gateway's (psutil,",
        "user + system, round by round): throughput per core read off the two processes, not",
        "off the share of the two cores the scheduler gave each in its turn. `--workers 2`",
        f"against one worker is judged on {ROUNDS + WORKER_ROUNDS} rounds: these {ROUNDS} and",
        f"{WORKER_ROUNDS} more measuring only those two, every target started as in the others",
        "(the ratio sits about a tenth over its target and its rounds spread by more: ADR 0002).",
        stub.describe(),
        "",
        "| target | " + " | ".join(FULL) + " |",
        "|---|" + "---|" * len(FULL),
    ]
    lines += [_row(name, cells, FULL) for name, cells in medians.items()]
    if litellm:
        lines.append(f"| {LITELLM} | {litellm} |" + " |" * (len(FULL) - 1))
    lines += ["", "| target | measured | verdict |", "|---|---|---|"]
    lines += _floor_verdicts(samples)
    lines += _peer_verdicts(samples, litellm)
    lines += _worker_verdicts(scaling)
    lines += _server_table(samples, medians)
    lines += _worker_cpu(scaling)
    # the section's own rounds of the workers rows are in both: each measurement counted once
    measured = {id(c): c for group in (samples, scaling) for c in _every_cell(group)}
    errors = sum(c["errors"] for c in measured.values())
    lines += ["", f"Non-200 answers during the run: {errors}.", ""]
    return lines


def _every_cell(samples: Samples) -> Iterator[Cell]:
    for cells in samples.values():
        for runs in cells.values():
            yield from runs


def _floor_verdicts(samples: Samples) -> list[str]:
    lines = []
    for cell in THROUGHPUT:
        r = ratio(samples, GATEWAY, FLOOR, cell)
        bare = ratio(samples, GATEWAY, BARE, cell)
        lines.append(
            f"| gateway/floor throughput, {cell} >= 70% | {r:.0%} "
            f"({spread(ratios(samples, GATEWAY, FLOOR, cell))}; {bare:.0%} of the "
            f"{DEFAULT_SERVER} bare proxy; {_per_core(samples, cell)}) | {verdict(r >= 0.7)} |"
        )
    seq = added(samples, GATEWAY, "direct", "sequential")
    floor = added(samples, FLOOR, "direct", "sequential")
    lines.append(
        f"| added p50, sequential, vs direct <= 1 ms | {seq:.2f} ms (the floor adds "
        f"{floor:.2f} ms) | {verdict(seq <= 1)} |"
    )
    first = added(samples, GATEWAY, "direct", "first frame")
    lines.append(
        f"| added p50 to the first stream frame (a few ms) | {first:.2f} ms | "
        f"{verdict(first <= 3)} |"
    )
    return lines


def _per_core(samples: Samples, cell: str) -> str:
    """The floor's CPU per request over the gateway's, round by round: requests per CPU second,
    the issue's "throughput per core" read off the processes themselves rather than off the
    share of the two cores the scheduler gave each server in its turn."""
    pairs = zip(samples[FLOOR][cell], samples[GATEWAY][cell], strict=True)
    shares = [f["cpu_us"] / g["cpu_us"] for f, g in pairs if "cpu_us" in f and "cpu_us" in g]
    return f"per CPU second {median(shares):.0%}" if shares else "CPU not read"


def _peer_verdicts(samples: Samples, litellm: str) -> list[str]:
    if litellm:
        return [f"| gateway vs LiteLLM | {litellm} | not measured |"]
    lines = []
    for cell in PEER[1:]:
        r = ratio(samples, GATEWAY, LITELLM, cell)
        lines.append(
            f"| gateway/LiteLLM throughput, {cell} >= 20x | {r:.1f}x | {verdict(r >= 20)} |"
        )
    ours = added(samples, GATEWAY, "direct", "sequential")
    theirs = added(samples, LITELLM, "direct", "sequential")
    lines.append(
        f"| added p50, sequential, <= 1/10 of LiteLLM's | {ours:.2f} ms vs {theirs:.2f} ms "
        f"(1/{theirs / ours if ours > 0 else float('inf'):.0f}) | {verdict(ours * 10 <= theirs)} |"
    )
    return lines


def _worker_verdicts(scaling: Samples) -> list[str]:
    lines = []
    for cell in THROUGHPUT:
        each = ratios(scaling, WORKERS, GATEWAY, cell)
        r = median(each)
        low, high = min(each), max(each)
        lines.append(
            f"| --workers 2 / one worker, {cell} >= 1.4x | {r:.2f}x ({len(each)} rounds, "
            f"{low:.2f}x-{high:.2f}x) | {verdict(r >= 1.4)} |"
        )
    return lines


def _worker_cpu(scaling: Samples) -> list[str]:
    """What the cores allow ``--workers 2``: CPU per request of each process (medians over the
    rounds), and the ratio 2 x one / (two + stub + generator) those costs permit when nothing
    else runs (one worker is held to one core; two share both with the stub and generator)."""
    lines = [
        "",
        "`--workers 2` and the cores: CPU microseconds per request (psutil, user + system, median",
        "of the rounds), and the ratio to one worker those costs allow on an otherwise idle",
        "machine, 2 x one / (both workers + stub + generator) (ADR 0002):",
        "",
        "| cell | one worker | two workers (both) | stub | generator | ratio allowed | measured |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in THROUGHPUT:
        one, two = scaling[GATEWAY][cell], scaling[WORKERS][cell]
        if not all("cpu_us" in c for c in [*one, *two]):
            continue
        g1 = median([c["cpu_us"] for c in one])
        g2 = median([c["cpu_us"] for c in two])
        rest = median([c["engine_us"] + c["generator_us"] for c in two])
        stub_us = median([c["engine_us"] for c in two])
        allowed = 2 * g1 / (g2 + rest)
        lines.append(
            f"| {cell} | {g1:.0f} | {g2:.0f} | {stub_us:.0f} | {rest - stub_us:.0f} | "
            f"{allowed:.2f}x | {ratio(scaling, WORKERS, GATEWAY, cell):.2f}x |"
        )
    return lines


def _server_table(samples: Samples, medians: dict[str, dict[str, Cell]]) -> list[str]:
    lines = [
        "",
        "Server comparison (same app objects; only the ASGI server differs; ratios to the floor):",
        "",
        "| server | bare plain c=64 req/s | gateway plain c=64 req/s | gateway/floor | "
        "bare stream c=64 | gateway stream c=64 | gateway/floor | gateway sequential p50 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for server in SERVERS:
        b, g = f"bare proxy ({server})", f"fleet-gateway ({server})"
        lines.append(
            f"| {server} | {medians[b]['plain c=64']['rps']:.0f} | "
            f"{medians[g]['plain c=64']['rps']:.0f} | "
            f"{ratio(samples, g, FLOOR, 'plain c=64'):.0%} | "
            f"{medians[b]['stream c=64']['rps']:.0f} | {medians[g]['stream c=64']['rps']:.0f} | "
            f"{ratio(samples, g, FLOOR, 'stream c=64'):.0%} | "
            f"{medians[g]['sequential']['p50_ms']:.2f} |"
        )
    return lines
