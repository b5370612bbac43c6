"""``fleet.yaml``: the gateway's static configuration, decoded strictly and checked as a whole.

Unlike wire types, configuration refuses unknown keys: a typo such as ``endpoint:`` must stop the
process with a line naming it, not leave an upstream silently without endpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from fleet_core.shared.errors import ConfigError

__all__ = [
    "EngineKind",
    "GatewayConfig",
    "HealthConfig",
    "RoutingConfig",
    "RoutingPolicy",
    "TenantConfig",
    "UpstreamConfig",
    "load_config",
]

EngineKind = Literal["vllm", "llamacpp", "openai"]
RoutingPolicy = Literal["least_load", "prefix_affinity"]
PositiveInt = Annotated[int, Meta(ge=1)]
PositiveFloat = Annotated[float, Meta(gt=0)]


class UpstreamConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One engine deployment: a served model behind one or more endpoints."""

    id: Annotated[str, Meta(min_length=1)]
    model: Annotated[str, Meta(min_length=1)]
    aliases: tuple[str, ...] = ()
    engine: EngineKind = "vllm"
    endpoints: tuple[str, ...] = ()
    base_url: str | None = None
    api_key: str = ""
    slots: PositiveInt | None = None
    fallbacks: tuple[str, ...] = ()
    tokenizer: str | None = None
    routing: RoutingPolicy | None = None
    """``least_load`` (score: in flight + engine queue + KV penalty) or ``prefix_affinity``
    (consistent hashing with bounded load on the session or prompt prefix); default
    ``routing.policy``."""

    def urls(self) -> tuple[str, ...]:
        found = self.endpoints or ((self.base_url,) if self.base_url else ())
        return tuple(url.rstrip("/") for url in found)


class HealthConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Active checks every ``interval_s``; passive ejection after ``eject_after`` failures."""

    interval_s: PositiveFloat = 5.0
    timeout_s: PositiveFloat = 2.0
    eject_after: PositiveInt = 3


class RoutingConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """How endpoints are chosen (docs/gateway.md "Routing", ADR 0013)."""

    policy: RoutingPolicy = "least_load"
    """The policy of pools that name none (discovered ones included)."""
    kv_threshold: Annotated[float, Meta(ge=0, lt=1)] = 0.8
    """KV-cache occupancy above which an engine's score is penalised."""
    kv_penalty: Annotated[float, Meta(ge=0)] = 8.0
    """The penalty at 100% occupancy, in requests-in-flight equivalents."""
    affinity_epsilon: Annotated[float, Meta(gt=0, le=10)] = 0.25
    """Affinity's load bound: no endpoint above (1 + ε) × the mean load (plus one)."""
    prefix_chars: Annotated[int, Meta(ge=16, le=1_000_000)] = 1024
    """How much of the rendered prompt (system prompt and conversation) keys prefix affinity."""
    session_from_user: bool = False
    """Also take the OpenAI ``user`` field as a session id (``X-Session-Id`` always counts)."""


class TenantConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Environment mode's per-tenant routing settings (database mode: the tenant's row)."""

    priority: Annotated[int, Meta(ge=1, le=100)] = 1
    """Share of a full endpoint's freed slots relative to other waiting tenants (weight)."""


class GatewayConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    listen: str = "127.0.0.1:8080"
    default_model: str | None = None
    upstreams: tuple[UpstreamConfig, ...] = ()
    health: HealthConfig = HealthConfig()
    routing: RoutingConfig = RoutingConfig()
    tenants: dict[str, TenantConfig] = {}
    queue_timeout_s: Annotated[float, Meta(ge=0)] = 5.0
    connect_timeout_s: PositiveFloat = 5.0
    read_timeout_s: PositiveFloat = 600.0
    usage_grace_s: Annotated[float, Meta(ge=0, le=60)] = 2.0


def load_config(path: Path) -> GatewayConfig:
    """Read and validate ``path``; any problem is a ConfigError of one line naming the key."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    try:
        config = msgspec.yaml.decode(raw, type=GatewayConfig) if raw.strip() else GatewayConfig()
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    validate(config, source=str(path))
    return config


def validate(config: GatewayConfig, *, source: str = "fleet.yaml") -> None:
    """Checks that span keys: references resolve, names are unique, URLs are URLs."""
    ids = [u.id for u in config.upstreams]
    for index, upstream in enumerate(config.upstreams):
        where = f"{source}: upstreams[{index}] ({upstream.id})"
        if ids.count(upstream.id) > 1:
            raise ConfigError(f"{where}: id is used twice; every upstream needs its own id")
        if upstream.endpoints and upstream.base_url:
            raise ConfigError(f"{where}: give either endpoints or base_url, not both")
        if not upstream.urls():
            raise ConfigError(f"{where}: needs endpoints: [http://host:port, ...] or base_url")
        for url in upstream.urls():
            _check_url(url, where)
        for fallback in upstream.fallbacks:
            if fallback not in ids or fallback == upstream.id:
                raise ConfigError(f"{where}: fallbacks names {fallback!r}, not another upstream id")
        _check_tokenizer(upstream.tokenizer, where)
    _check_names(config, source)


def _check_tokenizer(tokenizer: str | None, where: str) -> None:
    """A file must exist now (not fail the first request); ``registry:<id>`` is fetched later."""
    if not tokenizer:
        return
    if tokenizer.startswith("registry:"):
        if not tokenizer.removeprefix("registry:"):
            raise ConfigError(f"{where}: tokenizer 'registry:' needs a model id after the colon")
        return
    if not Path(tokenizer).is_file():
        raise ConfigError(
            f"{where}: tokenizer {tokenizer!r} is not a file; give a tokenizer.json path or "
            "registry:<model id>"
        )


def _check_url(url: str, where: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: endpoint {url!r} is not an http(s) URL")
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        raise ConfigError(f"{where}: endpoint {url!r} has an invalid port") from exc


def _check_names(config: GatewayConfig, source: str) -> None:
    owner: dict[str, str] = {u.model: u.model for u in config.upstreams}
    for upstream in config.upstreams:
        for alias in upstream.aliases:
            if owner.setdefault(alias, upstream.model) != upstream.model:
                raise ConfigError(
                    f"{source}: alias {alias!r} of {upstream.model!r} already names "
                    f"{owner[alias]!r}; an alias must select exactly one model"
                )
    if config.default_model is not None and config.default_model not in owner:
        raise ConfigError(
            f"{source}: default_model {config.default_model!r} is not a model or alias "
            "of any upstream"
        )
