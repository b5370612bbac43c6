"""``fleet-gateway``: the gateway's entry point. The environment is read here, once.

``fleet-gateway --config fleet.yaml [--listen HOST:PORT] [--workers N|auto] [--server uvicorn|
hypercorn]`` serves the OpenAI API (on uvicorn unless ``--server`` says otherwise: ADR 0002);
``--demo`` adds a stub engine (a child process) serving a model named ``demo`` so the gateway
runs with nothing else. With ``--workers`` above 1 this process supervises that many gateway
processes on the one port (``workers.py``). A configuration that cannot work exits with status 2
and one line saying what and how to fix it.

This module reaches only the gateway's own code: an import-linter contract keeps the control
plane, the model registry, the cost pool, the synthetic hub and the stub engine out of it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from fleet_core.gateway import workers
from fleet_core.gateway.admission.rate_policy import DIMENSIONS
from fleet_core.gateway.app import create_gateway_app, open_resources
from fleet_core.gateway.config import GatewayConfig, load_config
from fleet_core.gateway.demo import demo_engine, with_demo
from fleet_core.gateway.edge import scraping
from fleet_core.gateway.settings import GatewaySettings, from_env
from fleet_core.shared.asgi_server import (
    SERVERS,
    Server,
    listening_socket,
    parse_listen,
    run,
    serve_socket,
    settle_heap,
    stop_on_signals,
)
from fleet_core.shared.errors import ConfigError
from fleet_core.shared.logs import setup_logging

__all__ = ["gateway_main"]

log = logging.getLogger("fleet.main")


async def _run_gateway(
    settings: GatewaySettings, *, listen: str, server: Server, worker: str = ""
) -> None:
    """Serve until SIGTERM/SIGINT, then drain. ``worker``: "I/N" in a worker of --workers N."""
    stop = stop_on_signals()
    orphaned = asyncio.create_task(_stop_when_orphaned(stop)) if worker else None
    async with open_resources(settings) as resources:
        app = create_gateway_app(settings, resources)
        settle_heap()
        log.info(
            "fleet-gateway %slistening on %s (%s) with %d upstream(s)",
            f"worker {worker} (pid {os.getpid()}) " if worker else "",
            listen,
            server,
            len(settings.config.upstreams),
        )
        apps: list[object] = [app]
        if settings.metrics_listen:
            apps.append(scraping.metrics_app(app.state.metrics))
            log.info("fleet-gateway: /metrics without a credential on %s", settings.metrics_listen)
        sockets = _listen(listen, settings.metrics_listen, reuse_port=bool(worker))
        await asyncio.gather(
            *(
                serve_socket(
                    each,
                    sock,
                    grace_s=settings.shutdown_grace_s,
                    stop=stop,
                    server=server,
                    limits=settings.http_limits,
                )
                for each, sock in zip(apps, sockets, strict=True)
            )
        )
    if orphaned is not None:
        orphaned.cancel()
    log.info("fleet-gateway %sstopped", f"worker {worker} " if worker else "")


def _listen(listen: str, metrics: str | None, *, reuse_port: bool) -> list[socket.socket]:
    """The main socket, then the metrics-only one: both bound before either serves, so a port
    that is taken stops the gateway in one line rather than leaving one of them serving."""
    main = listening_socket(*parse_listen(listen), reuse_port=reuse_port)
    if metrics is None:
        return [main]
    try:
        return [main, listening_socket(*parse_listen(metrics), reuse_port=reuse_port)]
    except ConfigError:
        main.close()
        raise


async def _stop_when_orphaned(stop: asyncio.Event) -> None:
    """A worker whose supervisor died (SIGKILL, OOM) drains and exits rather than serve on."""
    parent = os.getppid()
    while os.getppid() == parent:  # noqa: ASYNC110 - no event says "reparented"; poll
        await asyncio.sleep(1)
    log.warning("fleet-gateway: the supervisor is gone; this worker drains and stops")
    stop.set()


def _gateway_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fleet-gateway", description=__doc__.split("\n")[0])
    arg = parser.add_argument
    arg("--config", type=Path, help="fleet.yaml (see docs/gateway.md)")
    arg("--listen", help="HOST:PORT, overrides fleet.yaml (default 127.0.0.1:8080)")
    arg("--demo", action="store_true", help="serve a stub model named 'demo'")
    arg("--workers", default="1", help="gateway processes on the port: N, or auto (the cores)")
    arg("--server", choices=SERVERS, default="uvicorn", help="the ASGI server (default uvicorn)")
    # Set by the supervisor for its workers; not for people.
    arg("--worker", type=int, help=argparse.SUPPRESS)
    arg("--demo-url", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _settings(args: argparse.Namespace, env: dict[str, str]) -> tuple[GatewaySettings, str]:
    config = load_config(args.config) if args.config else GatewayConfig()
    settings = from_env(env, config)
    listen = args.listen or config.listen
    parse_listen(listen)
    if settings.metrics_listen is not None:
        _metrics_listen(settings.metrics_listen, listen)
    if not (config.upstreams or args.demo or args.demo_url or settings.control_plane_url):
        raise ConfigError(
            "no upstreams: pass --config fleet.yaml, --demo, or set FLEET_CONTROL_PLANE_URL"
        )
    return settings, listen


def _metrics_listen(metrics: str, listen: str) -> None:
    """The metrics-only listener must be a port of its own: on the main one it would be the
    main listener, credential and all (or a bind error)."""
    try:
        port = parse_listen(metrics)[1]
    except ConfigError as exc:
        raise ConfigError(f"FLEET_METRICS_LISTEN: {exc}") from None
    if port == parse_listen(listen)[1] != 0:
        raise ConfigError(
            f"FLEET_METRICS_LISTEN={metrics} uses the gateway's own port ({listen}): give the "
            "metrics-only listener a port of its own, e.g. 0.0.0.0:9090"
        )


def _needs_shared_store(settings: GatewaySettings, count: int) -> None:
    """The memory store is per process: N workers would each grant the whole limit."""
    admission = settings.admission
    policy = admission.policy
    limited = bool(policy.tenants or policy.projects) or any(
        policy.default.get(dim) is not None for dim in DIMENSIONS
    )
    if count > 1 and admission.redis_url is None and (limited or settings.database is not None):
        raise ConfigError(
            f"--workers {count} with rate limits or budgets needs FLEET_REDIS_URL: the memory "
            "store is per process, so each worker would grant the whole limit"
        )


def _as_worker(settings: GatewaySettings, index: int, env: dict[str, str]) -> GatewaySettings:
    metrics_dir = env.get(workers.METRICS_DIR_ENV)
    if not metrics_dir:
        raise ConfigError("--worker is set by fleet-gateway --workers N; do not pass it yourself")
    database = settings.database
    if database is not None:
        spool = workers.spool_for(database.spool_path, index)
        database = dataclasses.replace(database, spool_path=spool)
    return dataclasses.replace(settings, metrics_dir=Path(metrics_dir), database=database)


def _adopt_spools(path: Path, count: int) -> None:
    """Spools of workers an earlier run had and this one has not go to this run's workers."""
    try:
        moved = workers.adopt_orphan_spools(path, count)
    except OSError as exc:
        log.warning("fleet-gateway: could not adopt old workers' spools (%s)", exc)
        return
    for orphan in moved:
        log.info("fleet-gateway: %s handed to this run's workers for replay", orphan)


def _demo_delay(env: dict[str, str]) -> float:
    raw = env.get("FLEET_DEMO_TOKEN_DELAY_MS", "") or "0"
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise ConfigError(f"FLEET_DEMO_TOKEN_DELAY_MS={raw!r} is not a number of ms") from None


def _refuse(exc: ConfigError) -> SystemExit:
    print(f"fleet-gateway: {exc}", file=sys.stderr)
    return SystemExit(2)


def _worker_argv(args: argparse.Namespace, listen: str, count: int, demo: str | None) -> list[str]:
    argv = ["--listen", listen, "--workers", str(count), "--server", args.server]
    argv += ["--config", str(args.config)] if args.config else []
    return argv + (["--demo-url", demo] if demo else [])


def gateway_main(argv: Sequence[str] | None = None) -> None:
    args = _gateway_args(argv)
    env = dict(os.environ)
    try:
        settings, listen = _settings(args, env)
        count = workers.parse_workers(args.workers)
        _needs_shared_store(settings, count)
        if args.worker is not None:
            settings = _as_worker(settings, args.worker, env)
        delay = _demo_delay(env) if args.demo else 0.0
    except ConfigError as exc:
        raise _refuse(exc) from None
    setup_logging(fmt=settings.log.format, level=settings.log.level)
    if args.worker is None and settings.database is not None:
        _adopt_spools(settings.database.spool_path, count)
    with contextlib.ExitStack() as stack:
        demo = args.demo_url
        if args.demo:
            try:
                demo = stack.enter_context(demo_engine(token_delay_ms=delay))
            except ConfigError as exc:
                raise _refuse(exc) from None
        if demo:
            settings = dataclasses.replace(settings, config=with_demo(settings.config, demo))
        if count > 1 and args.worker is None:
            worker_argv = _worker_argv(args, listen, count, demo)
            status = workers.supervise(worker_argv, count, grace_s=settings.shutdown_grace_s)
            raise SystemExit(status)
        worker = f"{args.worker}/{count}" if args.worker is not None else ""
        try:
            run(_run_gateway(settings, listen=listen, server=args.server, worker=worker))
        except ConfigError as exc:  # the port: taken, or not ours to bind
            raise _refuse(exc) from None
