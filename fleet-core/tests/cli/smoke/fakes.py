"""Deliberately broken servers for the smoke command's tests: each answers most calls the way a
working Fleet does and gets one thing wrong, so a test can show that the check meant to catch it
does. Served for real over loopback (``fleet_testing.asgi.serving``); nothing is patched."""

from __future__ import annotations

import json
import secrets
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

SHELL = (
    b"<!doctype html><html><head><script type=module src=/assets/app-1.js></script></head></html>"
)
PLACEHOLDER = b"<!doctype html><html><body>The console is not built: run make web.</body></html>"
SCRIPT = b"console.log('fleet');\n"


def _envelope(status: int, message: str, code: str = "not_found") -> JSONResponse:
    error = {"message": message, "type": "invalid_request_error", "code": code}
    return JSONResponse({"error": error}, status)


def console_app(*, shell: bytes, catch_all_assets: bool) -> Starlette:
    """A gateway's console: ``catch_all_assets`` serves the shell for every path, ``/assets``
    included (the bug); otherwise scripts are JavaScript and an unknown one is a 404."""

    async def page(request: Request) -> Response:
        path = request.url.path
        if path.startswith("/assets/") and not catch_all_assets:
            if path == "/assets/app-1.js":
                return Response(SCRIPT, media_type="text/javascript")
            return _envelope(404, f"no asset {path}")
        return Response(shell, media_type="text/html")

    return Starlette(routes=[Route("/{path:path}", page)])


def open_cors_app() -> Starlette:
    """CORS allowing every origin (the bug)."""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": []})

    cors = Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"])
    routes = [Route("/v1/models", models), Route("/api/v1/tenants", models)]
    return Starlette(routes=routes, middleware=[cors])


def _completion(stream: bool) -> Response:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    if not stream:
        message = {"role": "assistant", "content": "hello"}
        return JSONResponse({"choices": [{"index": 0, "message": message}], "usage": usage})

    async def frames() -> Any:
        for word in ("he", "llo", " there", "!"):  # usage on every frame, and never [DONE]
            delta = {"choices": [{"index": 0, "delta": {"content": word}}], "usage": usage}
            yield f"data: {json.dumps(delta)}\n\n".encode()

    return StreamingResponse(frames(), media_type="text/event-stream")


class Gateway:
    """An OpenAI-ish gateway whose streams end without ``[DONE]`` and carry usage unasked, whose
    /metrics labels a series with the last key it saw and has a decreasing histogram, and
    which publishes an out-of-range load signal."""

    def __init__(self) -> None:
        self.last_key = "none"

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def chat(self, request: Request) -> Response:
        self.last_key = request.headers.get("authorization", "").removeprefix("Bearer ")
        body = await request.json()
        if not isinstance(body, dict):
            return _envelope(400, "not an object", "invalid_request")
        if body.get("model") != "fake":
            return _envelope(404, "no such model", "model_not_found")
        return _completion(bool(body.get("stream")))

    async def embeddings(self, request: Request) -> Response:
        self.last_key = request.headers.get("authorization", "").removeprefix("Bearer ")
        usage = {"prompt_tokens": 3, "total_tokens": 3}
        return JSONResponse({"data": [{"embedding": [0.5, -0.5]}], "usage": usage})

    async def metrics(self, request: Request) -> Response:
        if not request.headers.get("authorization"):
            return _envelope(401, "needs a credential", "invalid_api_key")
        text = (
            "# TYPE fleet_requests_total counter\n"
            f'fleet_requests_total{{tenant="t",key="{self.last_key}"}} 1\n'
            "# TYPE fleet_request_duration_seconds histogram\n"
            'fleet_request_duration_seconds_bucket{model="fake",le="0.1"} 5\n'
            'fleet_request_duration_seconds_bucket{model="fake",le="1.0"} 3\n'
            'fleet_request_duration_seconds_bucket{model="fake",le="+Inf"} 5\n'
            'fleet_request_duration_seconds_count{model="fake"} 5\n'
            'fleet_request_duration_seconds_sum{model="fake"} 1.5\n'
            "# TYPE fleet_endpoint_kv_usage_ratio gauge\n"
            'fleet_endpoint_kv_usage_ratio{endpoint="http://e1"} 1.7\n'
        )
        return PlainTextResponse(text, headers={"Content-Type": "text/plain; version=0.0.4"})

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/models", self.models),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                Route("/metrics", self.metrics),
                Route("/healthz", self.healthz),
            ]
        )


class ControlPlane:
    """Makes tenants and keys as the real one does, and gets these wrong: the ledger never
    shows usage, inventory trusts a report's ``totalGpus`` (and miscounts an operator's cluster),
    cost rates are rounded to cents, and every model fits every engine."""

    def __init__(self) -> None:
        self.rates: list[dict[str, Any]] = []
        gpus = [{"vendor": "nvidia", "product": "L4", "memoryMib": 24576, "count": 4}]
        node = {"name": "n1", "ready": True, "schedulable": True, "gpus": gpus}
        self.reports: dict[str, Any] = {"prod-1": {"nodes": [node], "deployments": []}}
        self.deactivated: list[str] = []

    async def listed(self, request: Request) -> Response:
        """An operator's cluster whose summary says 8 GPUs while its one node has 4 (the bug)."""
        return JSONResponse({"data": [{"clusterId": "prod-1", "nodes": 1, "gpus": 8}]})

    async def made(self, request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"id": body.get("id", "x"), **body}, 201)

    async def key(self, request: Request) -> Response:
        secret = "fk_fake_" + secrets.token_urlsafe(16)
        return JSONResponse({"id": "key_" + secrets.token_hex(3), "secret": secret}, 201)

    async def patch_tenant(self, request: Request) -> Response:
        self.deactivated.append(request.path_params["tenant"])
        return JSONResponse({})

    async def ok(self, request: Request) -> Response:
        return JSONResponse({"id": "rule_fake", "status": "Ready", "secret": "op_fake"}, 200)

    async def empty(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": []})

    async def inventory(self, request: Request) -> Response:
        report = await request.json()
        self.reports[report["clusterId"]] = report
        nodes = report["nodes"]
        summary = {
            "nodes": len(nodes),
            "readyNodes": sum(1 for n in nodes if n["ready"]),
            "gpus": report.get("totalGpus", 0),  # the bug: the report's own total
            "gpusOnReadyNodes": 2,
            "deploymentsByPhase": {"Scheduling": 1, "Pending": 1},
        }
        return JSONResponse(summary)

    async def cluster(self, request: Request) -> Response:
        return JSONResponse({"report": self.reports.get(request.path_params["cluster"], {})})

    async def rates_get(self, request: Request) -> Response:
        cluster = request.query_params.get("cluster")
        return JSONResponse({"data": [r for r in self.rates if cluster in (None, r["cluster"])]})

    async def rates_post(self, request: Request) -> Response:
        rate = await request.json()
        rate["gpuHourMicro"] = round(rate["gpuHourMicro"], -4)  # the bug: cents
        self.rates.append(rate)
        return JSONResponse(rate, 201)

    async def close_month(self, request: Request) -> Response:
        if request.path_params["month"] == "2000-01":
            return _envelope(
                400, "2000-01 was observed 0.00% (no cluster)", "insufficient_coverage"
            )
        return _envelope(400, "not over yet", "period_not_over")

    async def no_month(self, request: Request) -> Response:
        return _envelope(404, "not closed")

    async def fit(self, request: Request) -> Response:
        engine = request.query_params.get("engine")
        return JSONResponse({"engine": engine, "fits": True, "reason": "anything goes"})

    def app(self) -> Starlette:
        write = ["POST", "PUT", "PATCH", "DELETE"]
        return Starlette(
            routes=[
                Route("/api/v1/tenants", self.made, methods=["POST"]),
                Route("/api/v1/tenants/{tenant}", self.patch_tenant, methods=["PATCH"]),
                Route("/api/v1/projects", self.made, methods=["POST"]),
                Route("/api/v1/keys", self.key, methods=["POST"]),
                Route("/api/v1/budget-rules", self.ok, methods=["POST"]),
                Route("/api/v1/budget-rules/{rule}", self.ok, methods=["DELETE"]),
                Route("/api/v1/usage", self.empty),
                Route("/api/v1/credentials", self.ok, methods=["POST"]),
                Route("/api/v1/credentials/{id}", self.ok, methods=["DELETE"]),
                Route("/api/v1/inventory", self.inventory, methods=["PUT"]),
                Route("/api/v1/inventory", self.listed),
                Route("/api/v1/clusters/{cluster}", self.cluster),
                Route("/api/v1/clusters/{cluster}", self.ok, methods=["DELETE"]),
                Route("/api/v1/clusters/{cluster}/binding", self.ok, methods=["PUT", "DELETE"]),
                Route("/api/v1/cost-rates", self.rates_get),
                Route("/api/v1/cost-rates", self.rates_post, methods=["POST"]),
                Route("/api/v1/cost-periods/{month}", self.close_month, methods=["PUT"]),
                Route("/api/v1/cost-periods/{month}", self.no_month),
                Route("/hub/api/models/{repo:path}", self.ok),
                Route("/api/v1/models", self.made, methods=["POST"]),
                Route("/api/v1/models/{id}/fit", self.fit),
                Route("/api/v1/models/{id}/pull", self.ok, methods=["POST"]),
                Route("/api/v1/models/{id}", self.ok, methods=["GET", *write]),
            ]
        )
