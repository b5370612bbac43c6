"""``fleet-gateway``: the gateway's entry point. The environment is read here, once.

``fleet-gateway --config fleet.yaml [--listen HOST:PORT]`` serves the OpenAI API; ``--demo`` adds a
stub engine (a child process) serving a model named ``demo`` so the gateway runs with nothing else.
A configuration that cannot work exits with status 2 and one line saying what and how to fix it.

This module reaches only the gateway's own code: an import-linter contract keeps the control
plane, the model registry, the cost pool, the synthetic hub and the stub engine out of it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from fleet_core.errors import ConfigError
from fleet_core.gateway.app import create_gateway_app, open_resources
from fleet_core.gateway.config import GatewayConfig, load_config
from fleet_core.gateway.demo import demo_engine, with_demo
from fleet_core.logs import setup_logging
from fleet_core.serving import parse_listen, run, serve_app, stop_on_signals
from fleet_core.settings import GatewaySettings, from_env

__all__ = ["gateway_main"]

log = logging.getLogger("fleet.main")


async def _run_gateway(settings: GatewaySettings, *, listen: str) -> None:
    """Serve until SIGTERM/SIGINT, then drain."""
    stop = stop_on_signals()
    async with open_resources(settings) as resources:
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


def _settings(args: argparse.Namespace, env: dict[str, str]) -> tuple[GatewaySettings, str]:
    config = load_config(args.config) if args.config else GatewayConfig()
    settings = from_env(env, config)
    listen = args.listen or config.listen
    parse_listen(listen)
    if not (config.upstreams or args.demo or settings.control_plane_url):
        raise ConfigError(
            "no upstreams: pass --config fleet.yaml, --demo, or set FLEET_CONTROL_PLANE_URL"
        )
    return settings, listen


def _demo_delay(env: dict[str, str]) -> float:
    raw = env.get("FLEET_DEMO_TOKEN_DELAY_MS", "") or "0"
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise ConfigError(f"FLEET_DEMO_TOKEN_DELAY_MS={raw!r} is not a number of ms") from None


def _refuse(exc: ConfigError) -> SystemExit:
    print(f"fleet-gateway: {exc}", file=sys.stderr)
    return SystemExit(2)


def gateway_main(argv: Sequence[str] | None = None) -> None:
    args = _gateway_args(argv)
    env = dict(os.environ)
    try:
        settings, listen = _settings(args, env)
    except ConfigError as exc:
        raise _refuse(exc) from None
    setup_logging(fmt=settings.log.format, level=settings.log.level)
    with contextlib.ExitStack() as stack:
        if args.demo:
            try:
                delay = _demo_delay(env)
                url = stack.enter_context(demo_engine(token_delay_ms=delay))
            except ConfigError as exc:
                raise _refuse(exc) from None
            config = with_demo(settings.config, url)
            settings = GatewaySettings(**{**settings.__dict__, "config": config})
        run(_run_gateway(settings, listen=listen))
