"""``fleet-serving run``: kopf's operator in-process, next to the inventory reporter.

``main()`` is the only place that reads the command line and the environment. Resources (the
Kubernetes API client, the HTTP session, the cluster view) are opened once in :func:`run` and handed
to handlers through kopf's memo, and to the two loops that run beside kopf: the reporter and the
resync.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence

import aiohttp
import kopf
from kubernetes_asyncio import client, config

from fleet_serving import resyncing
from fleet_serving import settings as settings_module
from fleet_serving.control_plane import WeightsClient
from fleet_serving.errors import ConfigError
from fleet_serving.handlers import Deps, build_registry
from fleet_serving.kube import Kube
from fleet_serving.reporting import Reporter
from fleet_serving.settings import Settings
from fleet_serving.view import ClusterView

__all__ = ["main", "run"]

logger = logging.getLogger("fleet_serving")


async def _kube_configuration(kubeconfig: str | None) -> client.Configuration:
    """In-cluster service account first, then the kubeconfig file, as kopf itself does."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return configuration
    except config.ConfigException:
        pass
    try:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        where = kubeconfig or "~/.kube/config"
        raise ConfigError(
            f"no Kubernetes credentials: not in a cluster, and {where} is unusable ({exc}); "
            "set KUBECONFIG"
        ) from exc
    return configuration


async def run(settings: Settings) -> None:
    """Run the operator until it is stopped (SIGINT/SIGTERM)."""
    configuration = await _kube_configuration(settings.kubeconfig)
    registry = build_registry()
    # The bare OperatorRegistry has no login handlers: use kopf's own, for the same client.
    kopf.on.login(registry=registry)(kopf.login_via_async_client)
    async with client.ApiClient(configuration) as api, aiohttp.ClientSession() as session:
        view = ClusterView(host_mounts=frozenset(settings.host_mount_namespaces))
        deps = Deps(
            view=view,
            kube=Kube(api),
            weights=WeightsClient(
                session,
                settings.reporter.url,
                token=settings.reporter.token,
                engine_token_secret=settings.engine_token_secret,
            ),
            weights_retry_s=min(15.0, settings.resync_seconds),
            fetch=settings.fetch_images,
        )
        reporter = Reporter(settings.reporter, view, session)
        tasks = [
            asyncio.create_task(reporter.run(), name="inventory-reporter"),
            asyncio.create_task(
                resyncing.resync_forever(deps, interval=settings.resync_seconds), name="resync"
            ),
        ]
        try:
            await kopf.operator(
                registry=registry,
                memo=deps,
                standalone=True,
                liveness_endpoint=settings.liveness,
                clusterwide=not settings.namespaces,
                namespaces=settings.namespaces,
            )
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def main(argv: Sequence[str] | None = None) -> None:
    """Console script entry point."""
    try:
        settings = settings_module.parse_args(sys.argv[1:] if argv is None else argv, os.environ)
        log_format = kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL
        kopf.configure(verbose=settings.verbose, log_format=log_format, log_refkey="object")
        if not settings.verbose:  # one line per liveness probe is noise
            logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
        logger.info(
            "starting",
            extra={"report_to": settings.reporter.url, "cluster": settings.reporter.cluster_id},
        )
        asyncio.run(run(settings))
    except ConfigError as exc:
        sys.stderr.write(f"fleet-serving: {exc}\n")
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
