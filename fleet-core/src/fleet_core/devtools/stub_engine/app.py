"""The stub engine's ASGI app factory.

``create_app`` builds everything one stub needs (engine, service, metrics registry) and keeps it
on ``app.state``, so two stubs in one process share nothing: a test may run a vLLM and a
llama.cpp stub side by side.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount, Route

from fleet_core.devtools.stub_engine import errors, metrics
from fleet_core.devtools.stub_engine.auth import BearerAuth
from fleet_core.devtools.stub_engine.engine import Engine
from fleet_core.devtools.stub_engine.routes import Routes
from fleet_core.devtools.stub_engine.settings import StubSettings

__all__ = ["create_app"]


def create_app(settings: StubSettings) -> Starlette:
    """The app for ``settings``; ``app.state`` holds ``settings``, ``engine`` and ``stats``."""
    engine = Engine(settings)
    registry = metrics.registry(engine)
    routes = Routes(engine, registry)
    v1 = [
        Route("/chat/completions", routes.chat, methods=["POST"]),
        Route("/completions", routes.completions, methods=["POST"]),
        Route("/embeddings", routes.embeddings, methods=["POST"]),
        Route("/models", routes.models, methods=["GET"]),
    ]
    keyed = [Middleware(BearerAuth, key=settings.api_key)] if settings.api_key else None
    served = [
        Mount("/v1", routes=v1, middleware=keyed),
        Route("/health", routes.health, methods=["GET"]),
        Route("/metrics", routes.metrics, methods=["GET"]),
        Route("/stats", routes.stats, methods=["GET"]),
        Route("/tokenize", routes.tokenize, methods=["POST"], middleware=keyed),
    ]
    if settings.profile == "llamacpp":  # vLLM has no /props
        served.append(Route("/props", routes.props, methods=["GET"]))
    app = Starlette(
        routes=served,
        exception_handlers=errors.handlers(settings.profile),
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.stats = engine.stats
    app.state.metrics_registry = registry
    return app
