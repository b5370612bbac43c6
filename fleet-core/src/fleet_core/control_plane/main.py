"""``fleet-apiserver``: the control plane's entry point. The environment is read here, once.

A configuration that cannot work exits with status 2 and one line saying what and how to fix it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from fleet_core.control_plane.app import ApiserverSettings, create_apiserver_app, open_resources
from fleet_core.control_plane.costs.service import cost_settings
from fleet_core.control_plane.registry.settings import registry_settings
from fleet_core.shared.asgi_server import parse_listen, run, serve_app, stop_on_signals
from fleet_core.shared.errors import ConfigError
from fleet_core.shared.logs import setup_logging
from fleet_core.shared.settings import (
    cors_origins_from_env,
    http_limits_from_env,
    log_from_env,
    shutdown_grace_from_env,
)
from fleet_core.shared.tokens import secret_from_env

__all__ = ["apiserver_main", "apiserver_settings"]

log = logging.getLogger("fleet.main")


def _apiserver_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="fleet-apiserver", description="Fleet's control plane (/api/v1)."
    )
    parser.add_argument("--listen", default="127.0.0.1:8081", help="HOST:PORT (127.0.0.1:8081)")
    return parser.parse_args(argv)


def apiserver_settings(env: Mapping[str, str], listen: str) -> ApiserverSettings:
    parse_listen(listen)
    return ApiserverSettings(
        listen=listen,
        database_url=env.get("FLEET_DATABASE_URL") or None,
        admin_token=secret_from_env(env, "FLEET_ADMIN_TOKEN"),
        shutdown_grace_s=shutdown_grace_from_env(env),
        http_limits=http_limits_from_env(env),
        cors_origins=cors_origins_from_env(env),
        log=log_from_env(env),
        registry=registry_settings(env),
        costs=cost_settings(env),
    )


async def _run_apiserver(settings: ApiserverSettings) -> None:
    stop = stop_on_signals()
    async with open_resources(settings) as resources:
        app = create_apiserver_app(settings, resources)
        mode = "database" if resources.pool is not None else "no database: inventory only"
        log.info("fleet-apiserver listening on %s (%s)", settings.listen, mode)
        await serve_app(
            app,
            settings.listen,
            grace_s=settings.shutdown_grace_s,
            stop=stop,
            limits=settings.http_limits,
        )
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
        run(_run_apiserver(settings))
    except ConfigError as exc:  # found at start: an unreachable or too new database
        print(f"fleet-apiserver: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
