"""Settings both servers read the same way: logging, CORS origins, the drain on SIGTERM and the
bounds on what a client may send before the app sees it.

Each server keeps its own frozen settings tree (``gateway.settings``, ``control_plane.app``);
what they share is read here, from a mapping passed in by ``main()``, never from ``os.environ``
at import time. The readers refuse a value that cannot work with one line naming the variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fleet_core.shared.errors import ConfigError
from fleet_core.shared.http_limits import HttpLimits

__all__ = [
    "LogSettings",
    "cors_origins_from_env",
    "env_choice",
    "env_positive_int",
    "env_seconds",
    "http_limits_from_env",
    "log_from_env",
    "shutdown_grace_from_env",
]


@dataclass(frozen=True)
class LogSettings:
    format: str = "text"
    """``text`` for people, ``json`` for one JSON object per line (FLEET_LOG_FORMAT)."""
    level: str = "INFO"
    """Root log level (FLEET_LOG_LEVEL)."""
    access: bool = True
    """One line per request with status and duration (FLEET_ACCESS_LOG)."""


def env_positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{name}={raw!r} is not a positive integer; set it to e.g. {default}")
    return int(raw)


def env_seconds(env: Mapping[str, str], name: str, default: float) -> float:
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


def env_choice(env: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    raw = env.get(name, default).lower() or default
    if raw not in allowed:
        raise ConfigError(f"{name}={raw!r} is not one of: {', '.join(allowed)}")
    return raw


def log_from_env(env: Mapping[str, str]) -> LogSettings:
    return LogSettings(
        format=env_choice(env, "FLEET_LOG_FORMAT", "text", ("text", "json")),
        level=env_choice(env, "FLEET_LOG_LEVEL", "info", ("debug", "info", "warning", "error")),
        access=env_choice(env, "FLEET_ACCESS_LOG", "true", ("true", "false")) == "true",
    )


def cors_origins_from_env(env: Mapping[str, str]) -> tuple[str, ...]:
    """Origins allowed besides loopback ones (FLEET_CORS_ORIGINS, comma-separated)."""
    return tuple(o.strip() for o in env.get("FLEET_CORS_ORIGINS", "").split(",") if o.strip())


def shutdown_grace_from_env(env: Mapping[str, str]) -> float:
    """On SIGTERM, how long in-flight requests may take to finish (FLEET_SHUTDOWN_GRACE_S)."""
    return env_seconds(env, "FLEET_SHUTDOWN_GRACE_S", 30.0)


def http_limits_from_env(env: Mapping[str, str]) -> HttpLimits:
    """What a client may send before the app sees it (`HttpLimits`): FLEET_HTTP_MAX_HEAD_BYTES,
    FLEET_HTTP_MAX_HEADERS, FLEET_HTTP_HEAD_TIMEOUT_S, FLEET_HTTP_BODY_TIMEOUT_S and
    FLEET_HTTP_KEEP_ALIVE_S; each time must be above zero (zero would close every connection)."""
    default = HttpLimits()
    times = {}
    for name, value in (
        ("FLEET_HTTP_HEAD_TIMEOUT_S", default.head_timeout_s),
        ("FLEET_HTTP_BODY_TIMEOUT_S", default.body_timeout_s),
        ("FLEET_HTTP_KEEP_ALIVE_S", default.keep_alive_s),
    ):
        times[name] = env_seconds(env, name, value)
        if times[name] == 0:
            raise ConfigError(f"{name}=0 would close every connection; set it to e.g. {value:g}")
    return HttpLimits(
        max_head_bytes=env_positive_int(env, "FLEET_HTTP_MAX_HEAD_BYTES", default.max_head_bytes),
        max_headers=env_positive_int(env, "FLEET_HTTP_MAX_HEADERS", default.max_headers),
        head_timeout_s=times["FLEET_HTTP_HEAD_TIMEOUT_S"],
        body_timeout_s=times["FLEET_HTTP_BODY_TIMEOUT_S"],
        keep_alive_s=times["FLEET_HTTP_KEEP_ALIVE_S"],
    )
