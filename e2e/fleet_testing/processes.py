"""Fleet's own servers as real processes, the one way tests, the end-to-end system and the
benchmarks start them: the control plane, the gateway, the stub engine and the synthetic hub.

Each is ``python -m <its entry module>`` (``fleet-gateway`` for the gateway, as deployed) on a
port from `ports.free_port`, with the caller's FLEET_ (and engine key) variables left out of its
environment so only what the test means reaches it, its output in a log named after it, and is
ready once its readiness URL answers (`waiting.until_answers`). Everything a `Processes` started
is stopped by its PID when the ``with processes(...)`` block ends. Async tests call these through
``asyncio.to_thread``, so the loop keeps serving whatever else the test runs while one starts.

PostgreSQL and Redis come from :mod:`fleet_testing.servers` (found or started once a session),
S3 from :mod:`fleet_testing.fix_s3`, Kubernetes from :mod:`fleet_testing.fix_kube` and
llama.cpp's server from :mod:`fleet_testing.engines`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fleet_testing.ports import free_port
from fleet_testing.waiting import until_answers

__all__ = [
    "Processes",
    "clean_env",
    "control_plane",
    "gateway",
    "gateway_in_front",
    "hub",
    "processes",
    "stub_engine",
]

BIN = Path(sys.executable).parent
READY_WITHIN_S = 60.0
"""A loaded 2-core machine can take tens of seconds to import and open a server's pools."""


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

    def serve(self, name: str, argv: list[str], env: dict[str, str], ready: str) -> None:
        """`start`, then wait until ``ready`` answers; a failure carries the log's tail."""
        process = self.start(name, argv, env)
        try:
            until_answers(ready, process, within=READY_WITHIN_S, what=name)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- {name} log ---\n{self.log(name)[-3000:]}") from None

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


@contextlib.contextmanager
def processes(logs: Path) -> Iterator[Processes]:
    """Processes logging into ``logs``, all stopped when the block ends."""
    running = Processes(logs)
    try:
        yield running
    finally:
        running.stop_all()


def control_plane(
    procs: Processes, env: Mapping[str, str], *, name: str = "apiserver", port: int | None = None
) -> str:
    """``python -m fleet_core.control_plane`` with ``env`` (FLEET_DATABASE_URL, …); its URL once
    ``/readyz`` answers."""
    url = f"http://127.0.0.1:{port or free_port()}"
    argv = [
        sys.executable,
        "-m",
        "fleet_core.control_plane",
        "--listen",
        url.removeprefix("http://"),
    ]
    procs.serve(name, argv, clean_env(**env), f"{url}/readyz")
    return url


def gateway(
    procs: Processes,
    env: Mapping[str, str],
    args: Sequence[str] = (),
    *,
    name: str = "gateway",
    host: str = "127.0.0.1",
    port: int | None = None,
    ready: str = "/healthz",
) -> str:
    """``fleet-gateway ARGS --listen HOST:PORT`` (``--config F``, ``--demo`` …) with ``env``, its
    access log off unless ``env`` says otherwise; its loopback URL once ``ready`` answers
    (``/readyz``: once an upstream passed its health check and admission is up)."""
    url = f"http://127.0.0.1:{port or free_port()}"
    argv = [str(BIN / "fleet-gateway"), *args, "--listen", f"{host}:{url.rsplit(':', 1)[1]}"]
    procs.serve(name, argv, clean_env(**{"FLEET_ACCESS_LOG": "false", **env}), f"{url}{ready}")
    return url


def gateway_in_front(
    procs: Processes, upstream: Mapping[str, str], *, name: str = "gateway"
) -> str:
    """``fleet-gateway`` with one static ``upstream`` (a fleet.yaml entry: id, model, engine,
    base_url, api_key …) written beside the logs; its URL once the upstream passed the gateway's
    first health check (``/readyz``)."""
    config = procs.logs / f"{name}.yaml"
    config.write_text(yaml.safe_dump({"upstreams": [dict(upstream)]}))
    return gateway(procs, {}, ["--config", str(config)], name=name, ready="/readyz")


def stub_engine(
    procs: Processes,
    args: Sequence[str] = (),
    *,
    name: str = "engine",
    env: Mapping[str, str] | None = None,
    port: int | None = None,
) -> str:
    """``python -m fleet_core.devtools.stub_engine ARGS --port PORT``; its URL once ``/health``
    answers."""
    port = port or free_port()
    argv = [sys.executable, "-m", "fleet_core.devtools.stub_engine", *args, "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    procs.serve(name, argv, clean_env(**(env or {})), f"{url}/health")
    return url


def hub(
    procs: Processes, args: Sequence[str] = (), *, name: str = "hub", port: int | None = None
) -> str:
    """``python -m fleet_core.devtools.hub ARGS`` (the synthetic Hugging Face hub); its URL once it
    serves ``fleet/tiny-gguf``."""
    url = f"http://127.0.0.1:{port or free_port()}"
    argv = [sys.executable, "-m", "fleet_core.devtools.hub", *args]
    argv += ["--listen", url.removeprefix("http://")]
    procs.serve(name, argv, clean_env(), f"{url}/api/models/fleet/tiny-gguf")
    return url
