"""The gateway's settings: one frozen tree, read from the environment once, in ``main()``.

Every field has a default and says what it is for. Nothing here reads ``os.environ`` at import
time; ``from_env`` takes the mapping explicitly so tests pass their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fleet_core.gateway.admission.key_ring import KeyRing, parse_keys
from fleet_core.gateway.admission.rate_policy import RatePolicy, parse_policy
from fleet_core.gateway.admission.service import OnStoreError
from fleet_core.gateway.config import GatewayConfig
from fleet_core.gateway.console.settings import ConsoleSettings, console_from_env
from fleet_core.shared.errors import ConfigError
from fleet_core.shared.http_limits import HttpLimits
from fleet_core.shared.settings import (
    LogSettings,
    cors_origins_from_env,
    env_choice,
    env_positive_int,
    env_seconds,
    http_limits_from_env,
    log_from_env,
    shutdown_grace_from_env,
)
from fleet_core.shared.tokens import secret_from_env

__all__ = [
    "AdmissionSettings",
    "DatabaseModeSettings",
    "GatewaySettings",
    "admission_from_env",
    "from_env",
]


@dataclass(frozen=True)
class AdmissionSettings:
    keys: KeyRing | None = field(default=None, repr=False)
    """Accepted keys (FLEET_AUTH_REQUIRED=true + FLEET_API_KEYS); None: auth off."""
    policy: RatePolicy = field(default_factory=RatePolicy)
    """Tenant and project limits (FLEET_RATE_*), FLEET_DEFAULT_MAX_TOKENS."""
    redis_url: str | None = field(default=None, repr=False)
    """Shared limit buckets in Redis (FLEET_REDIS_URL); unset: process memory."""
    redis_prefix: str = ""
    """Prefix of every Redis key the gateway writes (FLEET_REDIS_PREFIX)."""
    on_store_error: OnStoreError = "closed"
    """Redis down: ``closed`` answers 503, ``open`` serves unlimited (FLEET_RATE_ON_STORE_ERROR)."""
    rate_lease: Literal["auto", "off"] = "auto"
    """Redis buckets: ``auto`` admits most requests from this process's leased slice of each
    bucket (ADR 0016), ``off`` sends every request's charges to Redis (FLEET_RATE_LEASE)."""
    metrics_token: str | None = field(default=None, repr=False)
    """The credential for /metrics and /health's detail (FLEET_METRICS_TOKEN or
    FLEET_METRICS_TOKEN_FILE); in database mode a control plane ``metrics`` credential too."""
    cors_origins: tuple[str, ...] = ()
    """Origins allowed besides loopback ones (FLEET_CORS_ORIGINS, comma-separated)."""


@dataclass(frozen=True)
class DatabaseModeSettings:
    """The gateway in database mode: keys, limits, budgets and rates from the control plane's
    Postgres, and every request written to the ledger (FLEET_DATABASE_URL)."""

    url: str = field(repr=False)
    """Postgres, the same database as the control plane's (FLEET_DATABASE_URL)."""
    spool_path: Path = Path(".fleet/ledger-spool.jsonl")
    """Where ledger records wait while the database is away (FLEET_LEDGER_SPOOL)."""
    catalog_poll_s: float = 1.0
    """Reload keys/limits/rules this often even without a notification (FLEET_CATALOG_POLL_S)."""
    budget_refresh_s: float = 1.0
    """How often budget rules' usage is re-read from the rollups (FLEET_BUDGET_REFRESH_S)."""
    budget_hold_ttl_s: float = 60.0
    """A budget hold whose gateway stopped touching it (crashed) expires after this long
    (FLEET_BUDGET_HOLD_TTL_S); a live gateway writes each of its holds again within half of it."""
    ledger_flush_s: float = 0.2
    """How often the ledger writer takes a batch (FLEET_LEDGER_FLUSH_S, at most
    `MAX_LEDGER_FLUSH_S`; sooner when 500 records wait): what a process crash can lose."""
    key_usage_interval_s: float = 5.0
    """How often the keys seen are written as ``last_used_at`` (one UPDATE for all of them)."""


@dataclass(frozen=True)
class GatewaySettings:
    config: GatewayConfig = field(default_factory=GatewayConfig)
    """fleet.yaml: listen address, upstreams, health and timeouts."""
    max_body_bytes: int = 10 * 1024 * 1024
    """Largest request body accepted; more is 413 (FLEET_MAX_BODY_BYTES)."""
    control_plane_url: str | None = None
    """Poll the control plane's GET /api/v1/endpoints for endpoints (FLEET_CONTROL_PLANE_URL)."""
    control_plane_token: str | None = field(default=None, repr=False)
    """The gateway's ``gateway`` credential for the control plane (FLEET_CONTROL_PLANE_TOKEN or
    FLEET_CONTROL_PLANE_TOKEN_FILE); required with FLEET_CONTROL_PLANE_URL."""
    engine_key: str | None = field(default=None, repr=False)
    """The key sent as ``Authorization: Bearer`` to every discovered engine (FLEET_ENGINE_KEY_FILE,
    the namespace's ``fleet-engine-key`` Secret mounted read-only, or FLEET_ENGINE_KEY); read
    once at start. Static upstreams keep their own ``api_key`` (ADR 0010)."""
    discovery_interval_s: float = 1.0
    """How often discovery polls; a scale-up reaches routing within about this long."""
    shutdown_grace_s: float = 30.0
    """On SIGTERM, how long in-flight requests may take to finish (FLEET_SHUTDOWN_GRACE_S)."""
    http_limits: HttpLimits = field(default_factory=HttpLimits)
    """What a client may send before the app sees it (FLEET_HTTP_*: docs/security.md)."""
    requests_ring: int = 1000
    """How many recent usage records GET /api/v1/requests keeps in memory."""
    log: LogSettings = field(default_factory=LogSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    database: DatabaseModeSettings | None = None
    """Set: database mode; None: environment mode (FLEET_API_KEYS, FLEET_RATE_*)."""
    console: ConsoleSettings = field(default_factory=ConsoleSettings)
    """The operator console at ``/``: its built files and the control plane it calls."""
    metrics_dir: Path | None = None
    """In a worker of ``--workers N``: the directory every worker's metrics are written to and
    summed from (FLEET_WORKER_METRICS_DIR, set by the supervisor); None: one process."""
    metrics_listen: str | None = None
    """HOST:PORT of a second listener serving only ``GET /metrics``, without a credential, for a
    scraper that holds none (FLEET_METRICS_LISTEN); keep it where only the scraper reaches it
    (deploy/ does, with a NetworkPolicy). Unset: none, and /metrics needs the credential."""
    metrics_flush_s: float = 1.0
    """In a worker of ``--workers N``: at most how long after a change its metrics reach the
    shared files, so how old the other workers' counts in a scrape may be
    (FLEET_METRICS_FLUSH_S)."""


def admission_from_env(env: Mapping[str, str], *, database_mode: bool = False) -> AdmissionSettings:
    """Environment-mode admission; in database mode keys come from Postgres (auth always on)."""
    required = env_choice(env, "FLEET_AUTH_REQUIRED", "false", ("true", "false")) == "true"
    keys = parse_keys(env.get("FLEET_API_KEYS", ""))
    if database_mode:
        required = False
    elif required and not keys:
        raise ConfigError(
            "FLEET_AUTH_REQUIRED=true but FLEET_API_KEYS is empty: "
            "set FLEET_API_KEYS='tenant/project/keyid;...'"
        )
    if keys and not required:
        raise ConfigError(
            "FLEET_API_KEYS is set but FLEET_AUTH_REQUIRED is not true, so the keys would "
            "protect nothing: set FLEET_AUTH_REQUIRED=true (or unset FLEET_API_KEYS)"
        )
    on_error = env_choice(env, "FLEET_RATE_ON_STORE_ERROR", "closed", ("closed", "open"))
    lease = env_choice(env, "FLEET_RATE_LEASE", "auto", ("auto", "off"))
    return AdmissionSettings(
        keys=KeyRing(keys) if required else None,
        policy=parse_policy(env),
        redis_url=env.get("FLEET_REDIS_URL") or None,
        redis_prefix=env.get("FLEET_REDIS_PREFIX", ""),
        on_store_error="open" if on_error == "open" else "closed",
        rate_lease="off" if lease == "off" else "auto",
        metrics_token=secret_from_env(env, "FLEET_METRICS_TOKEN"),
        cors_origins=cors_origins_from_env(env),
    )


_ENV_MODE_ONLY = ("FLEET_API_KEYS", "FLEET_RATE_TENANTS", "FLEET_RATE_PROJECTS")


def database_mode_from_env(env: Mapping[str, str]) -> DatabaseModeSettings | None:
    url = env.get("FLEET_DATABASE_URL") or None
    if url is None:
        return None
    for name in _ENV_MODE_ONLY:
        if env.get(name, "").strip():
            raise ConfigError(
                f"{name} is set but FLEET_DATABASE_URL puts the gateway in database mode, where "
                "keys and limits come from the control plane: unset one of them"
            )
    return DatabaseModeSettings(
        url=url,
        spool_path=Path(env.get("FLEET_LEDGER_SPOOL") or ".fleet/ledger-spool.jsonl"),
        catalog_poll_s=env_seconds(env, "FLEET_CATALOG_POLL_S", 1.0) or 1.0,
        budget_refresh_s=env_seconds(env, "FLEET_BUDGET_REFRESH_S", 1.0) or 1.0,
        budget_hold_ttl_s=env_seconds(env, "FLEET_BUDGET_HOLD_TTL_S", 60.0) or 60.0,
        ledger_flush_s=_ledger_flush_s(env),
    )


MAX_LEDGER_FLUSH_S = 10.0
"""A crash loses up to one flush interval of ledger records: the setting cannot make that more."""


def _ledger_flush_s(env: Mapping[str, str]) -> float:
    value = env_seconds(env, "FLEET_LEDGER_FLUSH_S", 0.2)
    if not 0 < value <= MAX_LEDGER_FLUSH_S:
        raise ConfigError(
            f"FLEET_LEDGER_FLUSH_S={env['FLEET_LEDGER_FLUSH_S']!r} is not above 0 and at most "
            f"{MAX_LEDGER_FLUSH_S:g} seconds (a crash loses up to one interval of records)"
        )
    return value


def from_env(env: Mapping[str, str], config: GatewayConfig) -> GatewaySettings:
    """Settings from ``env`` (FLEET_* variables) on top of a loaded fleet.yaml."""
    database = database_mode_from_env(env)
    control_plane_url = env.get("FLEET_CONTROL_PLANE_URL") or None
    control_plane_token = secret_from_env(env, "FLEET_CONTROL_PLANE_TOKEN")
    if control_plane_url and not control_plane_token:
        raise ConfigError(
            "FLEET_CONTROL_PLANE_URL is set but FLEET_CONTROL_PLANE_TOKEN(_FILE) is not: issue a "
            'gateway credential (POST /api/v1/credentials {"role": "gateway"}) and set it'
        )
    for upstream in config.upstreams:
        if (upstream.tokenizer or "").startswith("registry:") and not control_plane_url:
            raise ConfigError(
                f"upstream {upstream.id!r} takes its tokenizer from the registry "
                f"({upstream.tokenizer}) but FLEET_CONTROL_PLANE_URL is not set: set it to the "
                "control plane's URL"
            )
    return GatewaySettings(
        database=database,
        config=config,
        max_body_bytes=env_positive_int(env, "FLEET_MAX_BODY_BYTES", 10 * 1024 * 1024),
        control_plane_url=control_plane_url,
        control_plane_token=control_plane_token,
        engine_key=secret_from_env(env, "FLEET_ENGINE_KEY"),
        shutdown_grace_s=shutdown_grace_from_env(env),
        http_limits=http_limits_from_env(env),
        metrics_flush_s=env_seconds(env, "FLEET_METRICS_FLUSH_S", 1.0),
        metrics_listen=env.get("FLEET_METRICS_LISTEN") or None,
        log=log_from_env(env),
        admission=admission_from_env(env, database_mode=database is not None),
        console=console_from_env(env),
    )
