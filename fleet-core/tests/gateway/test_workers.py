"""``fleet-gateway --workers N``: N real worker processes on one port behave as one
gateway — limits exact across workers, metrics that add up, SIGTERM drains every worker.

Each test starts a real supervisor with two workers; ``spread`` checks (through /proc, psutil)
that the connections really landed on both workers, so nothing here passes on one worker alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psutil  # type: ignore[import-untyped]
import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import CollectorRegistry

from fleet_core.devtools.stub_engine import StubSettings, create_app
from fleet_core.gateway import workers
from fleet_core.shared.errors import ConfigError
from fleet_testing.asgi import serving
from fleet_testing.ports import free_port
from fleet_testing.waiting import eventually, until_answers

from .conftest import issue_tenant_key
from .test_admission_processes import KEY, OPS, burst_client, chat
from .test_config_and_cli import run_cli


@given(
    affinity=st.integers(1, 512),
    quota=st.none() | st.tuples(st.integers(-1, 10**7), st.integers(1, 10**6)),
)
def test_cores_never_exceed_affinity_nor_quota(
    affinity: int, quota: tuple[int, int] | None
) -> None:
    cores = workers.cores_available(affinity, quota)
    assert 1 <= cores <= affinity
    if quota is not None and quota[0] > 0:
        assert cores == min(affinity, max(1, -(-quota[0] // quota[1])))


def test_cgroup_quota_files() -> None:
    assert workers.cgroup_quota("max 100000\n", None) is None
    assert workers.cgroup_quota("150000 100000\n", None) == (150000, 100000)
    assert workers.cores_available(16, workers.cgroup_quota("150000 100000", None)) == 2
    assert workers.cgroup_quota(None, ("-1\n", "100000\n")) is None
    assert workers.cgroup_quota(None, ("400000\n", "100000\n")) == (400000, 100000)
    assert workers.cgroup_quota("garbage", None) is None
    assert workers.parse_workers("auto") == workers.cores_here() >= 1


@pytest.mark.parametrize("value", ["0", "-2", "two", "", "99999"])
def test_a_bad_worker_count_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="--workers"):
        workers.parse_workers(value)


def test_spool_per_worker() -> None:
    path = Path("/var/fleet/ledger-spool.jsonl")
    assert workers.spool_for(path, 0) == path
    assert workers.spool_for(path, 3) == Path("/var/fleet/ledger-spool-3.jsonl")


@pytest.mark.parametrize(
    "env",
    [
        {"FLEET_RATE_RPM": "100"},
        {"FLEET_AUTH_REQUIRED": "true", "FLEET_API_KEYS": KEY, "FLEET_RATE_TENANTS": "acme|rpm=5"},
    ],
)
def test_memory_store_with_several_workers_refuses_to_start(env: dict[str, str]) -> None:
    result = run_cli("--demo", "--workers", "2", env=env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "needs FLEET_REDIS_URL" in result.stderr


def test_a_bad_workers_flag_is_one_line() -> None:
    result = run_cli("--demo", "--workers", "lots")
    assert result.returncode == 2
    assert result.stderr.startswith("fleet-gateway: --workers 'lots'")


@contextlib.asynccontextmanager
async def supervised(
    tmp_path: Path, env: dict[str, str], server: str = "uvicorn", **stub: object
) -> AsyncIterator[tuple[str, subprocess.Popen[str]]]:
    """A stub engine and ``fleet-gateway --workers 2 --server SERVER`` in front of it:
    (url, supervisor)."""
    async with serving(create_app(StubSettings(model="m", **stub))) as engine:  # type: ignore[arg-type]
        config = tmp_path / "fleet.yaml"
        config.write_text(f"upstreams:\n  - id: a\n    model: m\n    base_url: {engine}\n")
        port = free_port()
        proc = _supervisor(config, port, env, server)
        try:
            await _until_both_ready(proc, f"http://127.0.0.1:{port}")
            yield f"http://127.0.0.1:{port}", proc
        finally:
            if proc.poll() is None:
                proc.terminate()  # no requests left: the workers stop at once
                await asyncio.to_thread(proc.wait, 30)
            if proc.stderr is not None:
                proc.stderr.close()


def _supervisor(config: Path, port: int, env: dict[str, str], server: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "fleet_core.gateway", "--config", str(config)]
    command += ["--listen", f"127.0.0.1:{port}", "--workers", "2", "--server", server]
    full = {**os.environ, "FLEET_ACCESS_LOG": "false", **env}
    return subprocess.Popen(command, env=full, stderr=subprocess.PIPE, text=True)


def _workers(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(proc.pid).children()
    return []


async def _until_both_ready(proc: subprocess.Popen[str], url: str, within_s: float = 60) -> None:
    """Both workers listening and ready (each has its own health checks)."""
    port = int(url.rsplit(":", 1)[1])

    async def both_ready() -> bool:
        assert proc.poll() is None, "the supervisor exited"
        listening = [w for w in _workers(proc) if _connections(w, port, psutil.CONN_LISTEN)]
        if len(listening) != 2:
            return False
        async with httpx.AsyncClient() as http:  # a new connection each time: any worker
            return all([await _ready(http, url) for _ in range(8)])

    await eventually(both_ready, within=within_s, what="both workers ready", interval=0.2)


async def _ready(http: httpx.AsyncClient, url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return (await http.get(f"{url}/readyz", headers={"connection": "close"})).is_success
    return False


def _connections(worker: psutil.Process, port: int, status: str) -> int:
    with contextlib.suppress(psutil.Error):
        found = worker.net_connections(kind="tcp")
        return sum(1 for c in found if c.laddr and c.laddr.port == port and c.status == status)
    return 0


def spread(proc: subprocess.Popen[str], url: str) -> list[int]:
    """Established client connections each worker holds on the gateway's port."""
    port = int(url.rsplit(":", 1)[1])
    return [_connections(w, port, psutil.CONN_ESTABLISHED) for w in _workers(proc)]


def shared_env(redis_url: str, redis_prefix: str, **env: str) -> dict[str, str]:
    return {
        "FLEET_AUTH_REQUIRED": "true",
        "FLEET_API_KEYS": KEY,
        "FLEET_REDIS_URL": redis_url,
        "FLEET_REDIS_PREFIX": redis_prefix,
        "FLEET_METRICS_TOKEN": OPS,
        **env,
    }


async def test_two_workers_share_one_limit_exactly(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    # rpm=6 refills 0.1 a second: a burst of a few seconds cannot earn a whole extra request
    env = shared_env(redis_url, redis_prefix, FLEET_RATE_TENANTS="acme|rpm=6,tpm=100000")
    limits = httpx.Limits(max_connections=32)
    async with supervised(tmp_path, env) as (url, proc), httpx.AsyncClient(limits=limits) as http:
        statuses = await asyncio.gather(*(chat(http, url, 5) for _ in range(60)))
        per_worker = spread(proc, url)
    assert len(per_worker) == 2, per_worker
    assert min(per_worker) > 0, per_worker
    assert Counter(statuses) == {200: 6, 429: 54}


async def test_a_scrape_after_k_requests_shows_k_whichever_worker_answers(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    k = 120
    env = shared_env(redis_url, redis_prefix, FLEET_RATE_TENANTS="acme|rpm=100000,tpm=10000000")
    async with supervised(tmp_path, env) as (url, proc):
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=32)) as http:
            statuses = await asyncio.gather(*(chat(http, url, 5) for _ in range(k)))
            per_worker = spread(proc, url)
        assert Counter(statuses) == {200: k}
        assert len(per_worker) == 2, per_worker
        assert min(per_worker) > 0, per_worker
        # The other worker's counts reach the files within FLEET_METRICS_FLUSH_S (1 s): poll.
        scrapes = await _until_every_scrape_shows(url, k, within_s=15)
    for text in scrapes:
        assert _sample(text, "fleet_requests_total") == k
        assert _sample(text, "fleet_request_duration_seconds_count") == k
        assert _sample(text, "fleet_requests_in_flight") == 0


async def _until_every_scrape_shows(url: str, k: int, *, within_s: float) -> list[str]:
    """Six scrapes in a row (new connections: both workers answer) that all count ``k``."""
    seen: list[list[float]] = [[]]

    async def agreed() -> list[str] | None:
        scrapes = [await _scrape(url) for _ in range(6)]
        seen[0] = [_sample(text, "fleet_requests_total") for text in scrapes]
        return scrapes if seen[0] == [k] * 6 else None

    return await eventually(
        agreed, within=within_s, what=lambda: f"scrapes counted {seen[0]}", interval=0.2
    )


async def _scrape(url: str) -> str:
    async with httpx.AsyncClient() as http:
        got = await http.get(f"{url}/metrics", headers={"Authorization": f"Bearer {OPS}"})
    assert got.status_code == 200
    return got.text


def _sample(text: str, name: str) -> float:
    """The sum of every series of ``name`` in an exposition."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


@pytest.mark.parametrize("server", ["uvicorn", "hypercorn"])
async def test_sigterm_drains_every_worker(
    server: str, tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    env = shared_env(redis_url, redis_prefix, FLEET_SHUTDOWN_GRACE_S="30")
    reply = " ".join(["word"] * 30)
    running = supervised(tmp_path, env, server, token_delay_ms=60, reply=reply)
    async with running as (url, proc):
        async with burst_client() as http:
            started = [asyncio.Event() for _ in range(16)]
            streams = [asyncio.create_task(_stream(http, url, s)) for s in started]
            await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), 30)
            per_worker = spread(proc, url)
            proc.send_signal(signal.SIGTERM)
            outcomes = await asyncio.gather(*streams)
        code = await asyncio.to_thread(proc.wait, 40)
        stderr = proc.stderr.read() if proc.stderr else ""
    assert len(per_worker) == 2, per_worker
    assert min(per_worker) > 0, per_worker
    assert outcomes == [(30, True)] * 16  # every open stream ran to its end
    assert code == 0, stderr
    assert stderr.count("stopped") == 2, stderr  # both workers drained and stopped
    assert stderr.count(f"({server})") == 2, stderr  # each served by the server asked for


async def test_a_workers_counts_reach_the_files_in_its_sigterm_drain(tmp_path: Path) -> None:
    """One worker process with a flush interval of an hour, so only its drain can write: after
    SIGTERM, with streams still open, every request it served is in the files, none in flight."""
    env = {"FLEET_METRICS_FLUSH_S": "3600", workers.METRICS_DIR_ENV: str(tmp_path / "metrics")}
    (tmp_path / "metrics").mkdir()
    reply = " ".join(["word"] * 20)
    async with (
        serving(create_app(StubSettings(model="m", token_delay_ms=50, reply=reply))) as engine,
        _one_worker(tmp_path, engine, env) as (url, proc),
        burst_client() as http,
    ):
        assert [await chat(http, url, 5) for _ in range(9)] == [200] * 9
        started = [asyncio.Event() for _ in range(4)]
        streams = [asyncio.create_task(_stream(http, url, s)) for s in started]
        await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), 30)
        assert _files_sum(tmp_path / "metrics", "fleet_requests_total") == 0  # not yet
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.gather(*streams) == [(20, True)] * 4
        assert await asyncio.to_thread(proc.wait, 40) == 0
    assert _files_sum(tmp_path / "metrics", "fleet_requests_total") == 13
    assert _files_sum(tmp_path / "metrics", "fleet_request_duration_seconds_count") == 13
    assert _files_sum(tmp_path / "metrics", "fleet_time_to_first_token_seconds_count") == 4
    assert _files_sum(tmp_path / "metrics", "fleet_requests_in_flight") == 0
    assert [p.name for p in (tmp_path / "metrics").glob("gauge_livesum_*.db")] == [
        f"gauge_livesum_{proc.pid}.db"  # the name the supervisor removes when the worker is gone
    ]


@contextlib.asynccontextmanager
async def _one_worker(
    tmp_path: Path, engine: str, env: dict[str, str]
) -> AsyncIterator[tuple[str, subprocess.Popen[str]]]:
    """Worker 0 of ``--workers 2`` run on its own, as the supervisor would start it."""
    config = tmp_path / "fleet.yaml"
    config.write_text(f"upstreams:\n  - id: a\n    model: m\n    base_url: {engine}\n")
    port = free_port()
    proc = _worker_zero(config, port, env)
    try:
        await asyncio.to_thread(
            until_answers, f"http://127.0.0.1:{port}/healthz", proc, what="fleet-gateway"
        )
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.kill()
            await asyncio.to_thread(proc.wait, 30)
        if proc.stderr is not None:
            proc.stderr.close()


def _worker_zero(config: Path, port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "fleet_core.gateway", "--config", str(config)]
    command += ["--listen", f"127.0.0.1:{port}", "--workers", "2", "--worker", "0"]
    full = {**os.environ, "FLEET_ACCESS_LOG": "false", **env}
    return subprocess.Popen(command, env=full, stderr=subprocess.PIPE, text=True)


def _files_sum(directory: Path, name: str) -> float:
    """``name`` summed over every worker's file, as any worker's scrape sums them."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    found = [s for family in registry.collect() for s in family.samples if s.name == name]
    return sum(s.value for s in found)


async def _stream(http: httpx.AsyncClient, url: str, started: asyncio.Event) -> tuple[int, bool]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    words, done = 0, False
    headers = {"Authorization": f"Bearer {KEY}"}
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            started.set()
            done = done or line == "data: [DONE]"
            words += line.startswith("data: {") and '"content":"word' in line.replace(" ", "")
    return words, done


async def test_workers_stop_when_the_supervisor_is_killed(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with supervised(tmp_path, shared_env(redis_url, redis_prefix)) as (_, proc):
        children = _workers(proc)
        assert len(children) == 2
        proc.kill()  # SIGKILL: nothing forwards a signal to the workers
        await asyncio.to_thread(proc.wait, 10)
        _, alive = await asyncio.to_thread(psutil.wait_procs, children, 20)
    assert alive == []


async def test_database_mode_workers_write_one_ledger_row_per_request(
    tmp_path: Path,
    control_plane: httpx.AsyncClient,
    postgres_url: str,
    redis_url: str,
    redis_prefix: str,
) -> None:
    """Each worker has its own ledger writer and spool file; together they write exactly one row
    per request, none twice."""
    key = await issue_tenant_key(control_plane, tpm=10_000_000)
    env = {
        "FLEET_DATABASE_URL": postgres_url,
        "FLEET_REDIS_URL": redis_url,
        "FLEET_REDIS_PREFIX": redis_prefix,
        "FLEET_LEDGER_SPOOL": str(tmp_path / "spool.jsonl"),
    }
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    headers = {"Authorization": f"Bearer {key}"}
    async with supervised(tmp_path, env) as (url, proc):
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=32), timeout=30) as http:
            answers = await asyncio.gather(
                *(
                    http.post(f"{url}/v1/chat/completions", json=body, headers=headers)
                    for _ in range(60)
                )
            )
            per_worker = spread(proc, url)
        proc.terminate()  # the writers flush on the way down
        assert await asyncio.to_thread(proc.wait, 40) == 0
    assert [a.status_code for a in answers] == [200] * 60
    assert min(per_worker) > 0, per_worker
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        cursor = await conn.execute("SELECT count(*) FROM ledger")
        assert await cursor.fetchone() == (60,)


def test_spools_of_workers_gone_are_adopted(tmp_path: Path) -> None:
    """From 3 workers down to 2: worker 2's spool (a torn last line included) goes to worker 0's,
    its replaying file to worker 0's replaying file; workers 0 and 1 keep theirs."""
    path = tmp_path / "ledger-spool.jsonl"
    path.write_bytes(b'{"a":1}\n{"torn"')
    (tmp_path / "ledger-spool-1.jsonl").write_bytes(b'{"b":1}\n')
    (tmp_path / "ledger-spool-2.jsonl").write_bytes(b'{"c":1}\n')
    (tmp_path / "ledger-spool-2.jsonl.replaying").write_bytes(b'{"d":1}\n')
    moved = workers.adopt_orphan_spools(path, 2)
    assert sorted(p.name for p in moved) == [
        "ledger-spool-2.jsonl",
        "ledger-spool-2.jsonl.replaying",
    ]
    assert path.read_bytes() == b'{"a":1}\n{"torn"\n{"c":1}\n'
    assert (tmp_path / "ledger-spool.jsonl.replaying").read_bytes() == b'{"d":1}\n'
    assert (tmp_path / "ledger-spool-1.jsonl").read_bytes() == b'{"b":1}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ledger-spool-1.jsonl",
        "ledger-spool.jsonl",
        "ledger-spool.jsonl.replaying",
    ]
    assert workers.adopt_orphan_spools(path, 1) == [tmp_path / "ledger-spool-1.jsonl"]


def test_a_killed_demo_gateway_leaves_no_stub_engine() -> None:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "fleet_core.gateway",
        "--demo",
        "--listen",
        f"127.0.0.1:{port}",
    ]
    proc = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        until_answers(f"http://127.0.0.1:{port}/healthz", proc, what="fleet-gateway")
        [stub] = psutil.Process(proc.pid).children()
        proc.kill()
        proc.wait(timeout=10)
        _, alive = psutil.wait_procs([stub], timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert alive == []
