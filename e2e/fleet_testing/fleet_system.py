"""The whole of Fleet on one machine, for the end-to-end test from ``kubectl apply`` to a token.

Every part is a real process, started from code and stopped by its PID: ``fleet-apiserver``
(the control plane, on the test Postgres, with a directory object store), ``fleet-serving run``
(the operator, on the real API server of :mod:`fleet_testing.fix_kube`, watching one namespace),
``fleet-gateway`` in database mode (keys and ledger in Postgres, buckets in Redis, endpoints
discovered from the control plane, the engine key from a file as the mounted Secret), and the
kubelet stand-in (:mod:`fleet_testing.kubelet`) running the operator's pods — the registry fetch
init container and llama.cpp's ``llama-server``. Credentials are issued through the control
plane's API as an administrator would. Nothing of fleet-core is imported (P7 holds here too).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Api", "Processes", "free_port", "wait_http"]

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the caller's FLEET_ (or engine key) variables, plus ``extra``."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "LLAMA_", "VLLM_"))}
    return keep | extra


@dataclass
class Processes:
    """The processes a test started, each with its log; all stopped at :meth:`stop_all`."""

    logs: Path
    started: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.started[name] = process
        return process

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        for process in self.started.values():
            if process.poll() is None:
                process.terminate()
        for process in self.started.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_http(
    url: str, process: subprocess.Popen[bytes], *, within: float = 60.0, what: str = ""
) -> None:
    """Until ``url`` answers 200 (the process must stay up)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{what or url} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            exc.close()
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{what or url} did not answer within {within:g} s")


@dataclass(frozen=True)
class Api:
    """The control plane's HTTP API with one credential."""

    url: str
    token: str = field(repr=False)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            with exc:
                raise AssertionError(f"{method} {path}: {exc.code} {exc.read()!r}") from None

    def credential(self, role: str, **fields: str) -> str:
        issued = self.call("POST", "/api/v1/credentials", {"role": role, "label": role, **fields})
        return str(issued["secret"])

    def api_key(self, tenant: str) -> str:
        """A tenant, its default project and a key of it (what a client sends the gateway)."""
        self.call("POST", "/api/v1/tenants", {"id": tenant, "name": tenant})
        self.call("POST", "/api/v1/projects", {"tenantId": tenant, "name": "default"})
        issued = self.call(
            "POST", "/api/v1/keys", {"projectId": f"{tenant}/default", "label": "e2e"}
        )
        return str(issued["secret"])


def token_file(directory: Path, name: str, value: str) -> Path:
    """A secret handed over in a file (owner-only), as a mounted Secret would be."""
    path = directory / name
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def processes(logs: Path) -> Iterator[Processes]:
    running = Processes(logs)
    try:
        yield running
    finally:
        running.stop_all()


def random_token() -> str:
    return secrets.token_hex(32)
