"""Tests of the real-service harness itself (e2e/fleet_testing).

Every other test trusts these fixtures to hand out real, isolated servers; here each discovery
step is forced in turn, isolation is checked across tests, and the TCP proxy is made to fail.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from fleet_testing import servers
from fleet_testing.fix_proxy import ProxyFactory
from fleet_testing.ports import free_port, free_ports

ONLY_RUNNING = servers.Steps(env=False, embedded=False, container=False)
ONLY_EMBEDDED = servers.Steps(env=False, running=False, container=False)
NOTHING = servers.Steps(env=False, running=False, embedded=False, container=False)
START_BUDGET_S = 10.0
E2E_DIR = Path(__file__).resolve().parents[1]

Finder = Callable[..., AbstractContextManager[servers.Server]]


def _accepts(address: servers.Address) -> bool:
    """Independent of servers.py's probe: does anything accept TCP connections there?"""
    try:
        with socket.create_connection((address.host, address.port), timeout=2):
            return True
    except OSError:
        return False


def _enter(found: AbstractContextManager[servers.Server]) -> None:
    with found:
        pass


# -- step 1: the environment variable ------------------------------------------------------------


def test_env_postgres_url_is_used_verbatim(postgres_url: str) -> None:
    url = f"{postgres_url}?application_name=fleet-env-probe"
    with servers.postgres({servers.POSTGRES_ENV: url}) as server:
        assert server == servers.Server(url, "env")
        with psycopg.connect(server.url) as conn:
            row = conn.execute("SELECT current_database(), current_setting('application_name')")
            assert row.fetchone() == (urlsplit(postgres_url).path[1:], "fleet-env-probe")


def test_env_redis_url_is_used_verbatim(redis_url: str) -> None:
    url = servers.with_database(redis_url, "5")
    with servers.redis({servers.REDIS_ENV: url}) as server:
        assert server == servers.Server(url, "env")
        with redis.Redis.from_url(server.url) as client:
            assert client.client_info()["db"] == 5


def test_postgres_fixtures_read_the_env_variable(postgres_url: str, tmp_path: Path) -> None:
    """End to end through pytest: a session started with the variable set uses that server."""
    url = f"{postgres_url}?application_name=fleet-env-fixture"
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    (tmp_path / "test_probe.py").write_text(
        textwrap.dedent("""
        import os, psycopg

        def test_probe(postgres_server, postgres_url):
            assert postgres_server.source == "env"
            assert postgres_server.url == os.environ["FLEET_TEST_DATABASE_URL"]
            with psycopg.connect(postgres_url) as conn:
                row = conn.execute("SELECT current_setting('application_name')").fetchone()
            assert row == ("fleet-env-fixture",)
        """)
    )
    env = {**os.environ, servers.POSTGRES_ENV: url, "PYTHONPATH": str(E2E_DIR)}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "fleet_testing.fix_postgres"]
    argv += ["-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)]
    result = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# -- step 2: a server already running ------------------------------------------------------------


@pytest.mark.parametrize(
    ("find", "session_server", "variable"),
    [
        (servers.postgres, "postgres_server", servers.POSTGRES_ENV),
        (servers.redis, "redis_server", servers.REDIS_ENV),
    ],
    ids=["postgres", "redis"],
)
def test_running_server_is_found(
    find: Finder, session_server: str, variable: str, request: pytest.FixtureRequest
) -> None:
    """Step 2 on any machine: the session's own server stands in for one already running."""
    running: servers.Server = request.getfixturevalue(session_server)
    address = servers.address_of(running.url)
    assert _accepts(address)
    denied_env = {variable: "redis://denied.invalid:1/0"}
    with find(denied_env, address=address, steps=ONLY_RUNNING) as server:
        assert server.source == "running"
        assert servers.address_of(server.url) == address


def test_running_server_that_does_not_answer_is_an_error(postgres_server: servers.Server) -> None:
    """Something listens, but it is not Redis: say so, rather than silently starting another."""
    not_redis = servers.address_of(postgres_server.url)
    with pytest.raises(servers.StartError) as caught:
        _enter(servers.redis({}, address=not_redis, steps=ONLY_RUNNING))
    assert "\n" not in str(caught.value)
    assert servers.REDIS_ENV in str(caught.value)


# -- step 3: servers started from wheels ---------------------------------------------------------


def _answers_as_postgres_18(url: str) -> None:
    with psycopg.connect(url) as conn:
        version = conn.execute("SELECT version()").fetchone()
    assert version is not None
    assert "PostgreSQL 18" in version[0]


def _answers_as_redis_6(url: str) -> None:
    with redis.Redis.from_url(url) as client:
        assert client.ping() is True
        assert str(client.info("server")["redis_version"]).startswith("6.")


@pytest.mark.parametrize(
    ("find", "default", "answers"),
    [
        (servers.postgres, servers.POSTGRES_ADDRESS, _answers_as_postgres_18),
        (servers.redis, servers.REDIS_ADDRESS, _answers_as_redis_6),
    ],
    ids=["postgres", "redis"],
)
def test_embedded_server_starts_answers_and_stops(
    find: Finder, default: servers.Address, answers: Callable[[str], None]
) -> None:
    began = time.monotonic()
    with find({}, steps=ONLY_EMBEDDED) as server:
        assert time.monotonic() - began < START_BUDGET_S
        assert server.source == "embedded"
        address = servers.address_of(server.url)
        assert address != default
        answers(server.url)
    assert not _accepts(address)


# -- step 5: nothing found -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("find", "variable"),
    [(servers.postgres, servers.POSTGRES_ENV), (servers.redis, servers.REDIS_ENV)],
    ids=["postgres", "redis"],
)
@pytest.mark.parametrize("how", ["denied", "absent"])
def test_no_server_is_a_one_line_error(find: Finder, variable: str, how: str) -> None:
    if how == "denied":
        attempt = find({variable: "redis://ignored.invalid:1/0"}, steps=NOTHING)
    else:  # allowed, but no variable and nothing listening on the candidate port
        closed = servers.Address("127.0.0.1", free_port())
        attempt = find({}, address=closed, steps=servers.Steps(embedded=False, container=False))
    with pytest.raises(servers.NoServerError) as caught:
        _enter(attempt)
    message = str(caught.value)
    assert "\n" not in message
    assert variable in message
    assert message.startswith("no ")


# -- per-test isolation --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def earlier() -> dict[str, list[str]]:
    """What previous tests in this module were given, to check the next one gets something new."""
    return {"databases": [], "prefixes": []}


@pytest.mark.parametrize("run", ["first", "second"])
def test_each_test_gets_a_fresh_empty_database(
    run: str, postgres_url: str, postgres_server: servers.Server, earlier: dict[str, list[str]]
) -> None:
    name = urlsplit(postgres_url).path[1:]
    assert name.startswith("fleet_t_")
    assert name not in earlier["databases"]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == (name,)
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        assert tables.fetchone() == (0,)
        conn.execute("CREATE TABLE marker (run text)")
    with psycopg.connect(postgres_server.url) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", [earlier["databases"]]
        )
        assert left.fetchall() == []  # earlier tests' databases were dropped
    earlier["databases"].append(name)


@pytest.mark.parametrize("run", ["first", "second"])
def test_each_test_gets_its_own_redis_prefix(
    run: str, redis_url: str, redis_prefix: str, earlier: dict[str, list[str]]
) -> None:
    assert redis_prefix.startswith("t:")
    assert redis_prefix.endswith(":")
    assert redis_prefix not in earlier["prefixes"]
    with redis.Redis.from_url(redis_url) as client:
        assert list(client.scan_iter(match=f"{redis_prefix}*")) == []
        client.set(f"{redis_prefix}marker", run)
        for prefix in earlier["prefixes"]:  # earlier tests' keys were deleted
            assert list(client.scan_iter(match=f"{prefix}*")) == []
    earlier["prefixes"].append(redis_prefix)


# -- the TCP proxy -------------------------------------------------------------------------------


def test_proxy_forwards_cuts_and_resumes_postgres(
    tcp_proxy: ProxyFactory, postgres_url: str
) -> None:
    target = servers.address_of(postgres_url)
    proxy = tcp_proxy(target.host, target.port)
    url = proxy.url_for(postgres_url)
    assert servers.address_of(url) == proxy.address != target
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == (urlsplit(url).path[1:],)
        assert proxy.accepted == 1
        proxy.cut()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2)
    proxy.resume()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert proxy.accepted == 2


async def test_proxy_cuts_and_resumes_async_redis(
    tcp_proxy: ProxyFactory, redis_url: str, redis_prefix: str
) -> None:
    target = servers.address_of(redis_url)
    proxy = tcp_proxy(target.host, target.port)
    no_retry = Retry(NoBackoff(), 0)
    client = redis.asyncio.Redis.from_url(proxy.url_for(redis_url), retry=no_retry)
    key = f"{redis_prefix}through-proxy"
    try:
        await client.set(key, "v")
        proxy.cut()
        with pytest.raises(redis.ConnectionError):
            await client.get(key)
        proxy.resume()
        assert await client.get(key) == b"v"
    finally:
        await client.aclose()
    assert proxy.accepted == 2


def test_a_port_picked_for_a_later_server_is_outside_the_ephemeral_range() -> None:
    """Outgoing connections take their local ports from the ephemeral range; a port picked for
    a server that starts later must not be one they can take meanwhile, nor one picked before."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(1024 <= port < low for port in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))  # and free to bind


def test_ports_picked_in_pairs_are_both_free_and_never_handed_out_again() -> None:
    """SeaweedFS derives its gRPC port from each HTTP port (+10000): both must be free, below
    the ephemeral range, and neither handed out later."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    pairs = free_ports(5, also=10000)
    taken = {*pairs, *(port + 10000 for port in pairs)}
    assert len(taken) == 10
    assert all(1024 <= port < low for port in taken)
    assert not taken & {free_port() for _ in range(50)}
