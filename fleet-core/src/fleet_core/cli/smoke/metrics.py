"""Metrics: ``/metrics`` needs a credential while ``/healthz`` does not; the text format is the
versioned one Prometheus negotiates; a served request is counted for the tenant that spent it;
tokens split into the three billed sides; an embedding spends no completion tokens; histogram
buckets never decrease; and no series carries an API key in a label (a scrape is read by many)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from fleet_core.cli.smoke.context import Context
from fleet_core.cli.smoke.limited import Limited, limited_gateway
from fleet_core.cli.smoke.running import Runner

__all__ = ["AREA", "SIDES", "bucket_errors", "key_labels", "run", "samples"]

AREA = "Metrics"
SIDES = ("input_fresh", "input_cached", "output")
_VERSIONED = "text/plain; version=0.0.4"


def samples(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _sum(found: Iterable[Sample], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in found
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def bucket_errors(found: Iterable[Sample]) -> list[str]:
    """Histogram series whose cumulative buckets decrease, or whose +Inf is not the count."""
    buckets: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = defaultdict(
        list
    )
    counts: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for s in found:
        rest = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        if s.name.endswith("_bucket"):
            buckets[(s.name[: -len("_bucket")], rest)].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_count"):
            counts[(s.name[: -len("_count")], rest)] = s.value
    wrong = []
    for series, points in buckets.items():
        values = [v for _, v in sorted(points)]
        if any(b < a for a, b in itertools.pairwise(values)):
            wrong.append(f"{series[0]}{dict(series[1])} decreases")
        elif series in counts and values and values[-1] != counts[series]:
            wrong.append(
                f"{series[0]}{dict(series[1])} +Inf {values[-1]} != count {counts[series]}"
            )
    return wrong


def key_labels(found: Iterable[Sample], secrets: Iterable[str]) -> list[str]:
    """Series with a key (or a key's secret part) in a label value, or a label named like one."""
    needles = {n for key in secrets for n in (key, key.rsplit("/", 1)[-1]) if len(n) >= 8}
    wrong = []
    for s in found:
        for name, value in s.labels.items():
            if name.lower() in ("key", "api_key", "apikey", "authorization") or any(
                n in value for n in needles
            ):
                wrong.append(f"{s.name}{{{name}=...}}")
    return sorted(set(wrong))


async def _scrape(ctx: Context, gateway: Limited) -> list[Sample]:
    reply = await ctx.http.call("GET", f"{gateway.url}/metrics", token=gateway.metrics_token)
    return samples(reply.text) if reply.status == 200 else []


async def run(ctx: Context, runner: Runner) -> None:
    gateway = await limited_gateway(ctx)
    await _access(ctx, runner, gateway)
    model = await _model(ctx, gateway)
    before = await _scrape(ctx, gateway)
    body = {"model": model, "input": ["fleet smoke metrics embedding"]}
    await ctx.http.call("POST", f"{gateway.url}/v1/embeddings", token=gateway.other, body=body)
    after = await _scrape(ctx, gateway)
    _embedding(runner, gateway, before, after)
    chat = {
        "model": model,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "a cached prefix, then hi"}],
    }
    served = await ctx.http.call(
        "POST", f"{gateway.url}/v1/chat/completions", token=gateway.other, body=chat
    )
    found = await _scrape(ctx, gateway)
    _attribution(runner, gateway, found, served.status)
    errors = bucket_errors(found)
    runner.check(
        AREA,
        "histogram buckets never decrease (+Inf = count)",
        not errors,
        errors or "all monotone",
    )
    leaks = key_labels(found, gateway.secrets)
    runner.check(
        AREA,
        "no series is labelled with an API key",
        not leaks,
        leaks or f"{len(found)} samples clean",
    )


async def _model(ctx: Context, gateway: Limited) -> str:
    listed = (await ctx.http.call("GET", f"{gateway.url}/v1/models", token=gateway.other)).json()
    data = listed.get("data") if isinstance(listed, dict) else None
    return str(data[0]["id"]) if data else "unknown"


async def _access(ctx: Context, runner: Runner, gateway: Limited) -> None:
    health = await ctx.http.call("GET", f"{gateway.url}/healthz")
    runner.check(AREA, "/healthz needs no credential", health.status == 200, health.brief())
    anonymous = await ctx.http.call("GET", f"{gateway.url}/metrics")
    runner.check(
        AREA,
        "/metrics without a credential is refused",
        anonymous.status in (401, 403),
        anonymous.brief(),
    )
    tenant = await ctx.http.call("GET", f"{gateway.url}/metrics", token=gateway.other)
    runner.check(
        AREA, "/metrics refuses a tenant's API key", tenant.status in (401, 403), tenant.brief()
    )
    scrape = await ctx.http.call("GET", f"{gateway.url}/metrics", token=gateway.metrics_token)
    runner.check(
        AREA, "/metrics answers the metrics credential", scrape.status == 200, scrape.brief()
    )
    kind = scrape.headers.get("Content-Type", "")
    runner.check(
        AREA, "the text format is the versioned one (0.0.4)", kind.startswith(_VERSIONED), kind
    )


def _embedding(runner: Runner, gateway: Limited, before: list[Sample], after: list[Sample]) -> None:
    tenant = gateway.other_tenant
    spent = {
        side: _sum(after, "fleet_tokens_total", tenant=tenant, side=side)
        - _sum(before, "fleet_tokens_total", tenant=tenant, side=side)
        for side in SIDES
    }
    ok = spent["output"] == 0 and spent["input_fresh"] + spent["input_cached"] > 0
    runner.check(AREA, "an embedding spends input tokens and no completion tokens", ok, spent)


def _attribution(runner: Runner, gateway: Limited, found: list[Sample], status: int) -> None:
    tenant = gateway.other_tenant
    served = _sum(found, "fleet_requests_total", tenant=tenant, status_class="2xx")
    runner.check(
        AREA,
        "served requests are counted for the tenant that spent them",
        status == 200 and served >= 2,
        f"chat {status}; {tenant}: {served}",
    )
    sides = {s.labels.get("side") for s in found if s.name == "fleet_tokens_total"}
    runner.check(
        AREA,
        "tokens split into the three billed sides only",
        bool(sides) and sides <= set(SIDES),
        sorted(map(str, sides)),
    )
    mine = {side: _sum(found, "fleet_tokens_total", tenant=tenant, side=side) for side in SIDES}
    runner.check(
        AREA,
        "the tenant's input and output tokens are both counted",
        mine["output"] > 0 and mine["input_fresh"] > 0,
        mine,
    )
