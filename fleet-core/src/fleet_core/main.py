"""Console entry points. The environment is read here, once, and nowhere else.

``fleet-gateway --config fleet.yaml [--listen HOST:PORT]`` serves the OpenAI API; ``--demo`` adds an
in-process stub engine serving a model named ``demo`` so the gateway runs with nothing else.
A configuration that cannot work exits with status 2 and one line saying what and how to fix it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

from fleet_core.apiserver.app import ApiserverSettings, create_apiserver_app
from fleet_core.apiserver.app import open_resources as open_apiserver_resources
from fleet_core.auth.tokens import secret_from_env
from fleet_core.costs.service import cost_settings
from fleet_core.errors import ConfigError
from fleet_core.gateway.app import create_gateway_app, open_resources
from fleet_core.gateway.config import GatewayConfig, UpstreamConfig, load_config, validate
from fleet_core.logs import setup_logging
from fleet_core.registry.settings import registry_settings
from fleet_core.settings import GatewaySettings, from_env

__all__ = ["apiserver_main", "apiserver_settings", "gateway_main", "parse_listen", "serve_app"]

log = logging.getLogger("fleet.main")


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"listen address {value!r} is not HOST:PORT (e.g. 127.0.0.1:8080)")
    return (host.strip("[]") or "0.0.0.0"), int(port)


async def serve_app(app: object, listen: str, *, grace_s: float, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set, then stop accepting and drain for up to ``grace_s``."""
    host, port = parse_listen(listen)
    config = HypercornConfig()
    config.bind = [f"{host}:{port}"]
    config.graceful_timeout = grace_s
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = 75
    await serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


@contextlib.asynccontextmanager
async def _demo_upstream(
    config: GatewayConfig, *, token_delay_ms: float
) -> AsyncIterator[GatewayConfig]:
    from fleet_core.stub_engine import StubSettings, running_stub

    async with running_stub(StubSettings(model="demo", token_delay_ms=token_delay_ms)) as url:
        demo = UpstreamConfig(id="demo", model="demo", engine="vllm", base_url=url)
        merged = GatewayConfig(
            listen=config.listen,
            default_model=config.default_model or "demo",
            upstreams=(*config.upstreams, demo),
            health=config.health,
            queue_timeout_s=config.queue_timeout_s,
            connect_timeout_s=config.connect_timeout_s,
            read_timeout_s=config.read_timeout_s,
        )
        validate(merged, source="--demo")
        yield merged


async def _run_gateway(settings: GatewaySettings, *, demo: float | None, listen: str) -> None:
    """Serve until SIGTERM/SIGINT. ``demo``: the stub's token delay in ms, None for no demo."""
    stop = _stop_on_signals()
    async with contextlib.AsyncExitStack() as stack:
        if demo is not None:
            demo_cm = _demo_upstream(settings.config, token_delay_ms=demo)
            config = await stack.enter_async_context(demo_cm)
            settings = GatewaySettings(**{**settings.__dict__, "config": config})
        resources = await stack.enter_async_context(open_resources(settings))
        app = create_gateway_app(settings, resources)
        log.info(
            "fleet-gateway listening on %s with %d upstream(s)",
            listen,
            len(settings.config.upstreams),
        )
        await serve_app(app, listen, grace_s=settings.shutdown_grace_s, stop=stop)
    log.info("fleet-gateway stopped")


def _gateway_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fleet-gateway", description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, help="fleet.yaml (see docs/gateway.md)")
    parser.add_argument("--listen", help="HOST:PORT, overrides fleet.yaml (default 127.0.0.1:8080)")
    parser.add_argument("--demo", action="store_true", help="serve a stub model named 'demo'")
    return parser.parse_args(argv)


def gateway_main(argv: Sequence[str] | None = None) -> None:
    args = _gateway_args(argv)
    env = dict(os.environ)
    try:
        config = load_config(args.config) if args.config else GatewayConfig()
        settings = from_env(env, config)
        listen = args.listen or config.listen
        parse_listen(listen)
        if not (config.upstreams or args.demo or settings.control_plane_url):
            raise ConfigError(
                "no upstreams: pass --config fleet.yaml, --demo, or set FLEET_CONTROL_PLANE_URL"
            )
    except ConfigError as exc:
        print(f"fleet-gateway: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    setup_logging(fmt=settings.log.format, level=settings.log.level)
    demo = float(env.get("FLEET_DEMO_TOKEN_DELAY_MS", "0") or 0) if args.demo else None
    _run(_run_gateway(settings, demo=demo, listen=listen))


def _apiserver_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="fleet-apiserver", description="Fleet's control plane (/api/v1)."
    )
    parser.add_argument("--listen", default="127.0.0.1:8081", help="HOST:PORT (127.0.0.1:8081)")
    return parser.parse_args(argv)


def apiserver_settings(env: Mapping[str, str], listen: str) -> ApiserverSettings:
    parse_listen(listen)
    gateway = from_env(env, GatewayConfig())  # the shared FLEET_LOG_* / grace / CORS settings
    return ApiserverSettings(
        listen=listen,
        database_url=env.get("FLEET_DATABASE_URL") or None,
        admin_token=secret_from_env(env, "FLEET_ADMIN_TOKEN"),
        shutdown_grace_s=gateway.shutdown_grace_s,
        cors_origins=gateway.admission.cors_origins,
        log=gateway.log,
        registry=registry_settings(env, listen=listen),
        costs=cost_settings(env),
    )


async def _run_apiserver(settings: ApiserverSettings) -> None:
    stop = _stop_on_signals()
    async with open_apiserver_resources(settings) as resources:
        app = create_apiserver_app(settings, resources)
        mode = "database" if resources.pool is not None else "no database: inventory only"
        log.info("fleet-apiserver listening on %s (%s)", settings.listen, mode)
        await serve_app(app, settings.listen, grace_s=settings.shutdown_grace_s, stop=stop)
    log.info("fleet-apiserver stopped")


def apiserver_main(argv: Sequence[str] | None = None) -> None:
    args = _apiserver_args(argv)
    try:
        settings = apiserver_settings(dict(os.environ), args.listen)
    except ConfigError as exc:
        print(f"fleet-apiserver: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    setup_logging(fmt=settings.log.format, level=settings.log.level)
    try:
        _run(_run_apiserver(settings))
    except ConfigError as exc:  # found at start: an unreachable or too new database
        print(f"fleet-apiserver: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _run(main: object) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; this guards odd platforms
        asyncio.run(main)  # type: ignore[arg-type]
    else:
        uvloop.run(main)  # type: ignore[arg-type]
