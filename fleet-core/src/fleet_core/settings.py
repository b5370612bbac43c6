"""The gateway's settings: one frozen tree, read from the environment once, in ``main()``.

Every field has a default and says what it is for. Nothing here reads ``os.environ`` at import
time; ``from_env`` takes the mapping explicitly so tests pass their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleet_core.errors import ConfigError
from fleet_core.gateway.config import GatewayConfig

__all__ = ["GatewaySettings", "LogSettings", "from_env"]


@dataclass(frozen=True)
class LogSettings:
    format: str = "text"
    """``text`` for people, ``json`` for one JSON object per line (FLEET_LOG_FORMAT)."""
    level: str = "INFO"
    """Root log level (FLEET_LOG_LEVEL)."""
    access: bool = True
    """One line per request with status and duration (FLEET_ACCESS_LOG)."""


@dataclass(frozen=True)
class GatewaySettings:
    config: GatewayConfig = field(default_factory=GatewayConfig)
    """fleet.yaml: listen address, upstreams, health and timeouts."""
    max_body_bytes: int = 10 * 1024 * 1024
    """Largest request body accepted; more is 413 (FLEET_MAX_BODY_BYTES)."""
    control_plane_url: str | None = None
    """Poll the control plane's GET /api/v1/endpoints for endpoints (FLEET_CONTROL_PLANE_URL)."""
    discovery_interval_s: float = 1.0
    """How often discovery polls; a scale-up reaches routing within about this long."""
    shutdown_grace_s: float = 30.0
    """On SIGTERM, how long in-flight requests may take to finish (FLEET_SHUTDOWN_GRACE_S)."""
    requests_ring: int = 1000
    """How many recent usage records GET /api/v1/requests keeps in memory."""
    log: LogSettings = field(default_factory=LogSettings)


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{name}={raw!r} is not a positive integer; set it to e.g. {default}")
    return int(raw)


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ConfigError(f"{name}={raw!r} is not a non-negative number of seconds")
    return value


def _choice(env: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    raw = env.get(name, default).lower() or default
    if raw not in allowed:
        raise ConfigError(f"{name}={raw!r} is not one of: {', '.join(allowed)}")
    return raw


def from_env(env: Mapping[str, str], config: GatewayConfig) -> GatewaySettings:
    """Settings from ``env`` (FLEET_* variables) on top of a loaded fleet.yaml."""
    return GatewaySettings(
        config=config,
        max_body_bytes=_int(env, "FLEET_MAX_BODY_BYTES", 10 * 1024 * 1024),
        control_plane_url=env.get("FLEET_CONTROL_PLANE_URL") or None,
        shutdown_grace_s=_float(env, "FLEET_SHUTDOWN_GRACE_S", 30.0),
        log=LogSettings(
            format=_choice(env, "FLEET_LOG_FORMAT", "text", ("text", "json")),
            level=_choice(env, "FLEET_LOG_LEVEL", "info", ("debug", "info", "warning", "error")),
            access=_choice(env, "FLEET_ACCESS_LOG", "true", ("true", "false")) == "true",
        ),
    )
