"""The routing table: model names and aliases to pools of endpoints. Immutable by design.

A table is built whole from configuration plus discovery and swapped in with one assignment, so a
request sees either the old table or the new one, never half of each, and no lock is needed. The
runtime state of an endpoint (in flight, health) lives elsewhere, keyed by URL, so it survives a
swap and an in-flight request keeps the state object it acquired.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fleet_core.gateway.config import EngineKind, GatewayConfig, RoutingPolicy
from fleet_core.gateway.exchange.routing.adapters import AdapterOf
from fleet_core.shared import engine_keys
from fleet_core.shared.errors import InvalidRequest, ModelNotFound, shown

__all__ = ["DiscoveredModel", "Pool", "RoutingTable", "Target", "build_table"]

log = logging.getLogger("fleet.gateway.routing")


@dataclass(frozen=True, slots=True)
class Target:
    """One endpoint of a pool, with the settings of the upstream entry that declared it."""

    url: str
    engine: EngineKind
    upstream_id: str
    api_key: str = ""
    slots: int | None = None


@dataclass(frozen=True, slots=True)
class Pool:
    """Every endpoint serving one model name (``--served-model-name``), however declared."""

    name: str
    targets: tuple[Target, ...]
    aliases: tuple[str, ...] = ()
    fallbacks: tuple[str, ...] = ()  # names of other pools, tried in order
    tokenizer: str | None = None
    source: str = "config"
    routing: RoutingPolicy = "least_load"
    adapter: AdapterOf | None = None
    """Set when the name is a LoRA adapter served by its base's endpoints (ADR 0028)."""
    adapters_loaded: bool = False
    """Every endpoint loads LoRA adapters: a request for the base must ask for none."""

    @property
    def engine(self) -> EngineKind:
        return self.targets[0].engine if self.targets else "openai"


@dataclass(frozen=True)
class RoutingTable:
    pools: Mapping[str, Pool]
    default_model: str | None = None
    names: Mapping[str, str] = field(default_factory=dict)  # name or alias -> pool name

    def resolve(self, model: str | None) -> Pool:
        """The pool a request's ``model`` selects; the default when it names none."""
        if model is None:
            if self.default_model is None:
                raise InvalidRequest(
                    "you must provide a model parameter", param="model", code="missing_model"
                )
            model = self.default_model
        name = self.names.get(model)
        if name is None:
            raise ModelNotFound(
                f"The model {shown(model)} does not exist or is not served here; "
                "GET /v1/models lists the models this gateway serves.",
                param="model",
            )
        return self.pools[name]

    def fallback_chain(self, pool: Pool) -> list[Pool]:
        """The pool followed by its fallbacks, each once."""
        chain, seen = [pool], {pool.name}
        for name in pool.fallbacks:
            if name in self.pools and name not in seen:
                chain.append(self.pools[name])
                seen.add(name)
        return chain


@dataclass(frozen=True)
class DiscoveredModel:
    """A served model and its ready endpoints, as the control plane reports them."""

    name: str
    engine: EngineKind
    urls: tuple[str, ...]
    cluster_id: str | None = None
    """The cluster that serves them: its engine key is the one they get (ADR 0020)."""
    adapters: tuple[tuple[str, int], ...] = ()
    """LoRA adapters they serve beside the model: (name, id among the model's adapters)."""


@dataclass
class _PoolDraft:
    targets: list[Target] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    tokenizer: str | None = None
    source: str = "config"
    routing: RoutingPolicy | None = None
    adapter: AdapterOf | None = None

    def freeze(self, name: str, default_routing: RoutingPolicy, adapted: set[str]) -> Pool:
        return Pool(
            name=name,
            targets=tuple(self.targets),
            aliases=tuple(dict.fromkeys(self.aliases)),
            fallbacks=tuple(f for f in dict.fromkeys(self.fallbacks) if f != name),
            tokenizer=self.tokenizer,
            source=self.source,
            routing=self.routing or default_routing,
            adapter=self.adapter,
            adapters_loaded=bool(self.targets) and all(t.url in adapted for t in self.targets),
        )


def build_table(
    config: GatewayConfig, discovered: Iterable[DiscoveredModel] = (), *, engine_key: str = ""
) -> RoutingTable:
    """Merge static upstreams and discovered models into one table; same model, one pool.
    ``engine_key``: the fleet engine secret, from which each discovered endpoint gets its own
    cluster's key and no other (ADR 0020; none without a cluster); a URL also declared
    statically keeps its upstream's key."""
    drafts: dict[str, _PoolDraft] = {}
    id_to_model = {u.id: u.model for u in config.upstreams}
    for up in config.upstreams:
        draft = drafts.setdefault(up.model, _PoolDraft())
        draft.targets += [Target(url, up.engine, up.id, up.api_key, up.slots) for url in up.urls()]
        draft.aliases += up.aliases
        draft.fallbacks += [id_to_model[f] for f in up.fallbacks]
        draft.tokenizer = draft.tokenizer or up.tokenizer
        draft.routing = draft.routing or up.routing
    for model in discovered:
        draft = drafts.setdefault(model.name, _PoolDraft(source="discovery"))
        draft.targets += _discovered_targets(model, {t.url for t in draft.targets}, engine_key)
    for model in discovered:  # after every model: a model's own name is never an adapter's
        _add_adapters(drafts, model, engine_key)
    adapted = {url for model in discovered if model.adapters for url in model.urls}
    policy = config.routing.policy
    pools = {name: draft.freeze(name, policy, adapted) for name, draft in drafts.items()}
    names = {name: name for name in pools}
    for pool in pools.values():
        for alias in pool.aliases:
            names.setdefault(alias, pool.name)
    return RoutingTable(pools, config.default_model, names)


def _add_adapters(drafts: dict[str, _PoolDraft], model: DiscoveredModel, engine_key: str) -> None:
    """A pool per adapter of ``model``, over its endpoints. A name already taken by a model, or
    by an adapter of another base or id, keeps its pool: these endpoints would answer it with
    other weights (ADR 0028)."""
    for name, index in model.adapters:
        adapter = AdapterOf(model.name, index)
        draft = drafts.setdefault(name, _PoolDraft(source="discovery", adapter=adapter))
        if draft.adapter != adapter:
            log.warning("adapter %r of %r not routed: the name is taken", name, model.name)
            continue
        draft.targets += _discovered_targets(model, {t.url for t in draft.targets}, engine_key)


def _discovered_targets(model: DiscoveredModel, known: set[str], engine_key: str) -> list[Target]:
    """The model's endpoints not in ``known``, each with its cluster's engine key."""
    key = "" if model.cluster_id is None else engine_keys.cluster_key(engine_key, model.cluster_id)
    return [Target(u, model.engine, "discovered", key) for u in model.urls if u not in known]
