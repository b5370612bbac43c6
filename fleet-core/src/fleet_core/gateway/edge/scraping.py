"""The metrics-only listener (FLEET_METRICS_LISTEN): ``GET /metrics`` on a port of its own, with
no credential, for a scraper that holds none.

The main port's ``/metrics`` answers only the metrics credential, because its series name every
tenant and project. A Prometheus configured by ``prometheus.io/*`` annotations sends no
credential and was refused (401). This listener serves the same exposition and nothing else, so
what guards it is where it can be reached from: deploy/ lets only the monitoring namespace in
(a NetworkPolicy), and a Prometheus-operator user can point a ServiceMonitor at it as well.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fleet_core.gateway.metering.metrics import GatewayMetrics
from fleet_core.shared import web

__all__ = ["metrics_app"]


def metrics_app(metrics: GatewayMetrics) -> Starlette:
    """An app answering ``GET /metrics`` with ``metrics``' exposition, and 404 to all else."""

    async def prometheus(request: Request) -> Response:
        body, content_type = metrics.render(request.headers.get("accept"))
        return Response(body, headers={"Content-Type": content_type})

    routes = [Route("/metrics", prometheus, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers=web.exception_handlers())
