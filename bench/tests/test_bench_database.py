"""The database bench's verdicts: ratios and p50 growth taken round by round, with their spread.

The two ledgers are measured in interleaved rounds, so each round's pair shares the machine's
state; the median of the per-round growths is what the target judges.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import psycopg

from bench import database_bench as db
from bench.gateway_bench import Cell
from fleet_testing import servers


def _p50s(*values: float) -> list[Cell]:
    return [{"p50_ms": v} for v in values]


def test_growth_is_the_median_of_the_rounds_own_growths() -> None:
    empty = _p50s(0.40, 0.80, 0.50)
    full = _p50s(0.44, 0.60, 0.60)  # +10%, -25%, +20%
    assert math.isclose(db._growth(empty, full), 0.10)


def test_drift_between_rounds_does_not_read_as_growth() -> None:
    # The machine halves its speed between rounds; within each round the ledgers match.
    empty = _p50s(0.4, 0.8, 1.6)
    full = _p50s(0.4, 0.8, 1.6)
    assert db._growth(empty, full) == 0.0


def test_a_round_without_a_p50_is_left_out() -> None:
    empty = _p50s(0.5, math.nan, 0.5)
    full = _p50s(0.55, 0.5, math.nan)
    assert math.isclose(db._growth(empty, full), 0.10)


def _loaded(*rps: float) -> list[Cell]:
    return [{"rps": v} for v in rps]


def test_a_ratio_states_how_far_its_rounds_spread() -> None:
    samples = {
        db.DB_MODE: {db.LOADED: _loaded(850, 900, 400)},
        db.OFF: {db.LOADED: _loaded(1000, 1000, 0)},  # the last round got nothing done
    }
    assert math.isclose(db._ratio(samples, db.DB_MODE, db.OFF), 0.875)
    assert db._rounds(samples, db.DB_MODE, db.OFF) == "rounds 85%-90%"


def test_a_ratio_without_a_measured_round_says_so() -> None:
    samples = {db.DB_MODE: {db.LOADED: _loaded(850)}, db.OFF: {db.LOADED: _loaded(0)}}
    assert db._rounds(samples, db.DB_MODE, db.OFF) == "no round measured"


def test_postgres_cpu_counts_what_the_server_spent_on_a_query(postgres_url: str) -> None:
    """The Postgres column reads the server's own processes on this machine: a query that keeps
    a backend busy shows up in it, and not in the client's CPU."""
    with contextlib.ExitStack() as stack:
        conn = stack.enter_context(psycopg.connect(postgres_url))
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()
        if backend is None or not Path(f"/proc/{backend[0]}").exists():  # a server elsewhere
            local = stack.enter_context(servers.postgres({}))
            conn = stack.enter_context(psycopg.connect(local.url))
        before = db._postgres_cpu_s()
        started = time.process_time()
        conn.execute("SELECT count(*) FROM generate_series(1, 20000000)").fetchone()
        client = time.process_time() - started
        spent = db._postgres_cpu_s() - before
    assert spent >= 0.2  # a few seconds of work in the backend, not in this process
    assert client < spent
