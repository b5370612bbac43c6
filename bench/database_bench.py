"""Database mode: the gateway with keys, limits, budget rules and rates from
Postgres versus the same limits from the environment and versus no auth, limits or ledger at all,
and budget admission with an empty ledger versus one of millions of rows.

Targets: database-mode throughput at c=64 >= 85% of environment mode (same Redis buckets; the
database mode adds budget rules, rates and a ledger row per request) and >= 85% of the gateway
without auth, limits or ledger, judged twice: on a tenant with no budget rule (keys,
Redis limits, rates and the ledger: all a keyed request pays for) and on one under three rules, each
behind a gateway of its own; budget-rule admission latency with
``FLEET_BENCH_BUDGET_ROWS`` (default 5 million) ledger rows within 20% of an empty ledger —
admission reads rollup sums kept in memory, so only the background refresh touches the rows'
rollups, and its query time is shown too. The two ledgers are two databases, each behind its own
database-mode gateway, measured in interleaved rounds and compared round by round: one after
the other, first empty then filled, the comparison measured the machine's drift between the two
(from -53% to +52% in two runs of the same code).

Every round starts every gateway afresh. Two processes of the same gateway on the same code differ
steadily by up to a tenth in throughput (memory layout, hash seeds: ADR 0002), so a run that kept
one process per gateway carried one draw of that luck into every round's ratio, and more rounds
could not average it out. A second no-auth gateway runs as a control: what it reads of the first is
what these ratios resolve.

Every gateway runs on ``fleet-gateway``'s default server (read from its command line) behind the
Go stub engine, driven by the Go load generator (`stub`, `generator`). Each cell also records the
gateway process's CPU time per request, steadier than requests/s on a shared machine, and the
Postgres server's: it writes the ledger on the same cores, so its share is throughput the
database-mode gateways cannot have here (a deployment's database has cores of its own). A gateway's
warnings and errors go to a log file, not to nowhere: a round with non-200 answers is reported
with what the gateway logged (a round without a single 200 once showed up only as ``nan``), and
medians leave such rounds' missing latencies out rather than sort a NaN among numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench import database_rows, generator, stub
from bench.admission_bench import redis_url
from bench.database_rows import BIG, RULELESS_SECRET, SECRET
from bench.gateway_bench import (
    ENV,
    ROUNDS,
    SECONDS,
    Cell,
    Samples,
    load,
    load_average,
    median,
    process,
    rotated,
    spread,
)
from bench.ledger_bench import postgres_server, scratch_database
from bench.report import verdict
from fleet_core.gateway import main as gateway_main
from fleet_core.gateway.admission import catalog, leases
from fleet_core.gateway.settings import DatabaseModeSettings
from fleet_testing.ports import free_port
from fleet_testing.waiting import until_answers

__all__ = ["report", "run"]

ROWS = int(os.environ.get("FLEET_BENCH_BUDGET_ROWS", "5000000"))
ENV_KEY = "acme/research/bench"
ENV_LIMITS = {
    "FLEET_AUTH_REQUIRED": "true",
    "FLEET_API_KEYS": ENV_KEY,
    "FLEET_RATE_TENANTS": f"acme|rpm=100000000,tpm={BIG}",
    "FLEET_RATE_PROJECTS": f"acme/research|rpm=100000000,tpm={BIG}",
}
LOADED = "plain c=64"
CELLS = ("sequential", LOADED)
ENV_MODE, DB_MODE, OFF = "environment mode", "database mode", "no auth, limits or ledger"
RULELESS = "database mode, a tenant with no budget rule"
TWIN = "no auth, a second process (control)"
WARNED = ("WARNING", "ERROR", "CRITICAL")


async def _refresh_ms(url: str, repeats: int = 20) -> float:
    """Median time of the budget refresh query (the part that reads the rollups)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            await catalog.rule_usage(conn)
            times.append((time.perf_counter() - started) * 1000)
    return median(times)


@dataclass(frozen=True)
class Target:
    """One gateway under test: where it listens, the key it wants, its process and its log."""

    name: str
    url: str
    key: str | None
    pid: int
    log: Path


def default_server() -> str:
    """The server ``fleet-gateway`` runs on unless ``--server`` says otherwise: what the
    targets judge, read from the gateway's own command line rather than named here."""
    return str(gateway_main._gateway_args([]).server)


@contextlib.contextmanager
def _gateway(name: str, key: str | None, config: Path, env: dict[str, str]) -> Iterator[Target]:
    """``bench.serve`` on the default server; its log (warnings and errors) kept in a file
    beside ``config``, so that a round with failures can say what the gateway saw."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = config.parent / f"{'-'.join(name.replace(',', '').split())}.log"
    command = [sys.executable, "-m", "bench.serve", default_server(), "gateway", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, str(config)], stdout=subprocess.DEVNULL, stderr=out, env={**ENV, **env}
        )
        try:
            until_answers(url + "/healthz", proc, within=120)
            yield Target(name, url, key, proc.pid, log)
        finally:
            proc.terminate()
            proc.wait(timeout=20)


Mode = tuple[str, str | None, dict[str, str]]
"""A gateway to start: its name, the key it wants (None: no auth) and its environment."""


def _database_mode(database_url: str, redis: str, prefix: str) -> dict[str, str]:
    """Database mode's environment; its ledger spool is given where the gateway starts."""
    return {
        "FLEET_REDIS_URL": redis,
        "FLEET_ACCESS_LOG": "false",
        "FLEET_REDIS_PREFIX": prefix,
        "FLEET_DATABASE_URL": database_url,
    }


@contextlib.contextmanager
def _behind_one_engine(modes: list[Mode]) -> Iterator[list[Target]]:
    """A stub engine and one gateway per mode in front of it; each database-mode gateway
    spools its ledger to a file of its own."""
    engine = free_port()
    direct = f"http://127.0.0.1:{engine}"
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        config = tmp / "fleet.yaml"
        config.write_text(f"upstreams:\n  - id: bench\n    model: bench\n    base_url: {direct}\n")
        stack.enter_context(process(stub.command(engine, "bench"), direct + "/health"))
        targets = []
        for i, (name, key, env) in enumerate(modes):
            if "FLEET_DATABASE_URL" in env:
                env = {**env, "FLEET_LEDGER_SPOOL": str(tmp / f"spool-{i}.jsonl")}
            targets.append(stack.enter_context(_gateway(name, key, config, env)))
        yield targets


@contextlib.contextmanager
def gateways(database_url: str, redis: str) -> Iterator[list[Target]]:
    """Environment mode, database mode (a tenant under three budget rules, and one under none,
    each on a gateway of its own), the gateway without auth, limits or ledger (the
    baseline) and a second process of that gateway (the control: what two identical gateways
    read of each other is the resolution of every ratio here), all on the same engine; the
    limited ones on the same Redis."""
    shared = {"FLEET_REDIS_URL": redis, "FLEET_ACCESS_LOG": "false"}
    env_mode = {**shared, **ENV_LIMITS, "FLEET_REDIS_PREFIX": "bench-env:"}
    db_mode = _database_mode(database_url, redis, "bench-db:")
    modes: list[Mode] = [
        (ENV_MODE, ENV_KEY, env_mode),
        (DB_MODE, SECRET, db_mode),
        (RULELESS, RULELESS_SECRET, _database_mode(database_url, redis, "bench-ruleless:")),
        (OFF, None, {"FLEET_ACCESS_LOG": "false"}),
        (TWIN, None, {"FLEET_ACCESS_LOG": "false"}),
    ]
    with _behind_one_engine(modes) as targets:
        yield targets


EMPTY, FULL = "database mode, empty ledger", "database mode, full ledger"


@contextlib.contextmanager
def ledger_gateways(empty_url: str, full_url: str, redis: str) -> Iterator[list[Target]]:
    """Two database-mode gateways, on an empty ledger and on a full one, same engine and Redis."""
    modes: list[Mode] = [
        (EMPTY, SECRET, _database_mode(empty_url, redis, "bench-empty:")),
        (FULL, SECRET, _database_mode(full_url, redis, "bench-full:")),
    ]
    with _behind_one_engine(modes) as targets:
        yield targets


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _postgres_cpu_s() -> float:
    """CPU seconds (user + system) the Postgres processes on this machine have used: the bench's
    own server, whose backends write the ledger on the cores the gateway runs on (0 for a server
    elsewhere, ``FLEET_BENCH_DATABASE_URL``)."""
    ticks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        name, _, rest = stat.partition("(")[2].rpartition(")")
        if name == "postgres":
            fields = rest.split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


AFTERMATH_S = leases.IDLE_S + 2 * leases.SWEEP_S + DatabaseModeSettings.ledger_flush_s
"""How long a gateway's own work outlasts its load: the ledger's last batch, the lease slices
given back once idle. Every cell waits this long after it, so that the next target (always
the same one: rotation keeps the order) does not pay for it (ADR 0002)."""


def measure(target: Target, cell: str) -> Cell:
    """One cell against ``target``, with the gateway's CPU milliseconds per request answered
    (warm-up included, which runs at the same rate): what one request costs the gateway,
    steadier than requests/s on a machine other work shares. And Postgres's, its last batch
    included: the ledger's writes run on the same cores and take their share of them."""
    before, postgres = _cpu_s(target.pid), _postgres_cpu_s()
    figures = load(target.url, cell, target.key)
    used = _cpu_s(target.pid) - before
    time.sleep(AFTERMATH_S)  # the ledger's last batch is written meanwhile
    postgres = _postgres_cpu_s() - postgres
    answered = (figures["requests"] + figures["errors"]) * (1 + min(1.0, SECONDS / 4) / SECONDS)
    answered = max(answered, 1)
    return {**figures, "cpu_ms": used * 1000 / answered, "postgres_ms": postgres * 1000 / answered}


def run(rows: int = ROWS) -> dict[str, object]:
    samples: dict[str, dict[str, list[Cell]]] = {}
    loads = [load_average()]
    with contextlib.ExitStack() as stack:
        redis = stack.enter_context(redis_url())
        server = stack.enter_context(postgres_server())
        database, empty, full = (stack.enter_context(scratch_database(server)) for _ in range(3))
        for url in (database, empty, full):
            database_rows.seed(url)
        print(f"bench: filling a ledger with {rows} rows", file=sys.stderr)
        fill_s = database_rows.fill(full, rows)
        logged: dict[str, list[str]] = {}
        for round_ in range(ROUNDS):
            with gateways(database, redis) as targets:  # fresh processes every round
                for cell in CELLS:
                    for target in rotated(targets, round_):
                        samples.setdefault(target.name, {}).setdefault(cell, []).append(
                            measure(target, cell)
                        )
                for t in targets:
                    logged[t.name] = _distinct([*logged.get(t.name, []), *_warnings(t.log)])
            loads.append(load_average())
            print(f"bench: database mode round {round_ + 1} of {ROUNDS}", file=sys.stderr)
        ledgers: dict[str, list[Cell]] = {}
        for round_ in range(ROUNDS):
            with ledger_gateways(empty, full, redis) as pair:
                time.sleep(2)  # a few budget refreshes on each ledger's rollups
                for target in rotated(pair, round_):
                    ledgers.setdefault(target.name, []).append(
                        load(target.url, "sequential", SECRET)
                    )
                    time.sleep(AFTERMATH_S)
                for t in pair:
                    logged[t.name] = _distinct([*logged.get(t.name, []), *_warnings(t.log)])
        refresh_empty = asyncio.run(_refresh_ms(empty))
        refresh_full = asyncio.run(_refresh_ms(full))
    return {
        "samples": samples,
        "empty": ledgers[EMPTY],
        "full": ledgers[FULL],
        "refresh_empty_ms": refresh_empty,
        "refresh_full_ms": refresh_full,
        "rows": rows,
        "fill_s": fill_s,
        "loads": loads,
        "logged": logged,
    }


def _warnings(log: Path) -> list[str]:
    """The first distinct warning and error lines a gateway logged (bench.serve logs no less)."""
    lines = log.read_text(errors="replace").splitlines()
    return _distinct([line[:200] for line in lines if line.startswith(WARNED)])


def _distinct(lines: list[str], most: int = 5) -> list[str]:
    return list(dict.fromkeys(lines))[:most]


def _median(values: list[float]) -> float:
    """The median of the values that are numbers (a cell without one 200 has no p50)."""
    numbers = [v for v in values if not math.isnan(v)]
    return median(numbers) if numbers else math.nan


def _ratio(samples: Samples, a: str, b: str, key: str = "rps") -> float:
    """Round-by-round ``a / b`` at c=64, then the median (rounds where ``b`` got nothing done
    are left out, not divided by)."""
    return _median(_ratios(samples, a, b, key))


def _ratios(samples: Samples, a: str, b: str, key: str = "rps") -> list[float]:
    pairs = zip(samples[a][LOADED], samples[b][LOADED], strict=True)
    return [x[key] / y[key] if y[key] else math.nan for x, y in pairs]


def _rounds(samples: Samples, a: str, b: str) -> str:
    """The lowest and highest round's ``a / b`` (throughput at c=64): how far rounds spread."""
    return spread([r for r in _ratios(samples, a, b) if not math.isnan(r)])


def _errors(samples: Samples, logged: dict[str, list[str]]) -> list[str]:
    """Every cell that got answers other than 200, with what its gateway logged."""
    lines = []
    for name, cells in samples.items():
        for cell, runs in cells.items():
            failed = [f"{c['errors']:.0f} of {c['errors'] + c['requests']:.0f}" for c in runs]
            if any(c["errors"] for c in runs):
                lines.append(f"- {name}, {cell}: non-200 or failed per round: {', '.join(failed)}")
        lines += [f"  - logged: `{line}`" for line in logged.get(name, [])]
    return lines or ["Every request of every round was answered 200."]


def report(result: dict[str, object]) -> list[str]:
    samples, loads, logged = result["samples"], result["loads"], result["logged"]
    empty, full = result["empty"], result["full"]
    assert isinstance(loads, list)
    assert isinstance(samples, dict)
    assert isinstance(empty, list)
    assert isinstance(full, list)
    assert isinstance(logged, dict)
    ratio = _ratio(samples, DB_MODE, ENV_MODE)
    over_off = _ratio(samples, DB_MODE, OFF)
    cpu_over_off = 1 / _ratio(samples, DB_MODE, OFF, key="cpu_ms")
    ruleless = _ratio(samples, RULELESS, OFF)
    cpu_ruleless = 1 / _ratio(samples, RULELESS, OFF, key="cpu_ms")
    twin = _ratio(samples, TWIN, OFF)
    p50_empty = _median([c["p50_ms"] for c in empty])
    p50_full = _median([c["p50_ms"] for c in full])
    growth = _growth(empty, full)
    lines = [
        "## Database mode",
        "",
        f"The gateway on {default_server()} (`fleet-gateway`'s default server) against the stub",
        "engine, tenant + project limits in Redis in both modes; database mode adds the catalog",
        "from Postgres, unit rates, one ledger row per request (batched COPY) and, for acme's",
        "key, three budget rules; a second database-mode gateway serves a tenant with no rule.",
        f"Medians of {ROUNDS} interleaved rounds, every gateway started afresh each round;",
        "ratios taken round by round. CPU ms/req: the gateway process's CPU time per request",
        "at c=64, steadier than requests/s when other work shares the cores; beside it, the",
        "Postgres server's (every process of it), which writes the ledger on the same cores.",
        generator.describe(),
        stub.describe(),
        f"Machine load before and after each round: {'; '.join(loads)}.",
        "",
        "| gateway | sequential req/s / p50 / p99 | plain c=64 req/s / p50 / p99 "
        "| CPU ms/req | Postgres CPU ms/req |",
        "|---|---|---|---|---|",
    ]
    for name, cells in samples.items():
        row = " | ".join(
            f"{_median([c['rps'] for c in cells[cell]]):.0f} / "
            f"{_median([c['p50_ms'] for c in cells[cell]]):.2f} / "
            f"{_median([c['p99_ms'] for c in cells[cell]]):.2f}"
            for cell in CELLS
        )
        cpu = _median([c["cpu_ms"] for c in cells[LOADED]])
        postgres = _median([c.get("postgres_ms", math.nan) for c in cells[LOADED]])
        lines.append(f"| {name} | {row} | {cpu:.3f} | {postgres:.3f} |")
    lines += [
        "",
        *_errors(samples, logged),
        "",
        f"Budget admission with an empty ledger and with {result['rows']:,} ledger rows over",
        f"30 days (filled and rolled up in {result['fill_s']:.0f} s), database mode, sequential,",
        "on two databases with a gateway each, in interleaved rounds compared round by round",
        "(the empty ledger holds only the rows its own rounds add):",
        "",
        "| ledger | p50 ms | budget refresh query ms (background, every second) |",
        "|---|---|---|",
        f"| empty | {p50_empty:.2f} | {result['refresh_empty_ms']:.2f} |",
        f"| {result['rows']:,} rows | {p50_full:.2f} | {result['refresh_full_ms']:.2f} |",
        "",
        "Resolution: the control, a second no-auth process started and measured as the first,",
        f"read {twin:.0%} of it ({_rounds(samples, TWIN, OFF)}).",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| database-mode throughput >= 85% of environment mode, c=64 | {ratio:.0%} "
        f"({_rounds(samples, DB_MODE, ENV_MODE)}) | {verdict(ratio >= 0.85)} |",
        f"| database mode, a tenant with no budget rule, >= 85% of the gateway without auth, "
        f"limits or ledger, c=64 | {ruleless:.0%} (by CPU per request: "
        f"{cpu_ruleless:.0%}; {_rounds(samples, RULELESS, OFF)}) | {verdict(ruleless >= 0.85)} |",
        f"| database mode, three budget rules on the tenant and its project, >= 85% of the "
        f"gateway without auth, limits or ledger, c=64 | {over_off:.0%} "
        f"(by CPU per request: {cpu_over_off:.0%}; {_rounds(samples, DB_MODE, OFF)}) | "
        f"{verdict(over_off >= 0.85)} |",
        f"| budget admission p50 with the full ledger within 20% of empty | {growth:+.0%} | "
        f"{verdict(growth <= 0.20)} |",
        "",
    ]
    return lines


def _growth(empty: list[Cell], full: list[Cell]) -> float:
    """How much slower the sequential p50 was on the full ledger: round by round, then the
    median (a round where either side has no p50 is left out)."""
    pairs = zip(empty, full, strict=True)
    return _median([f["p50_ms"] / e["p50_ms"] - 1 if e["p50_ms"] else math.nan for e, f in pairs])
