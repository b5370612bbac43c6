"""The registry's settings: where weights are kept, which hub they come from, how patient to be."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleet_core.control_plane.registry.s3 import S3Settings
from fleet_core.shared.errors import ConfigError

__all__ = ["DEFAULT_HUB_URL", "RegistrySettings", "S3Settings", "registry_settings"]

DEFAULT_HUB_URL = "https://huggingface.co"


@dataclass(frozen=True)
class RegistrySettings:
    models_dir: str = ".dev/models"
    """The directory object store when ``s3`` is unset (FLEET_MODELS_DIR); the default suits a
    checkout (.dev is gitignored): set it in production."""
    s3: S3Settings | None = None
    """An S3-compatible store (FLEET_S3_ENDPOINT and the other FLEET_S3_* variables)."""
    hub_url: str = DEFAULT_HUB_URL
    """The Hugging Face hub, or anything speaking its API (FLEET_HUB_URL)."""
    hf_token: str | None = field(default=None, repr=False)
    """Sent to the hub as a bearer token, never logged (FLEET_HF_TOKEN)."""
    stall_timeout_s: float = 30.0
    """A hub that sends nothing this long fails the pull (FLEET_HUB_STALL_TIMEOUT_S)."""
    chunk_size: int = 1 << 20
    """Bytes read from the hub at a time."""
    persist_every_s: float = 1.0
    """How often a running pull's progress is written to Postgres."""
    resume_on_start: bool = True
    """At start, resume pulls a restart interrupted; False marks them Failed instead."""


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={value!r} is not a boolean (true or false)")


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    value = env.get(name, "").strip()
    try:
        seconds = float(value) if value else default
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError(f"{name}={value!r} must be a positive number of seconds")
    return seconds


def _s3(env: Mapping[str, str]) -> S3Settings | None:
    endpoint = env.get("FLEET_S3_ENDPOINT", "").strip()
    if not endpoint:
        return None
    if "://" in endpoint or "/" in endpoint:
        raise ConfigError(
            f"FLEET_S3_ENDPOINT={endpoint!r} must be host:port (set FLEET_S3_USE_SSL for https)"
        )
    download = env.get("FLEET_S3_DOWNLOAD_ENDPOINT", "").strip() or None
    if download is not None and ("://" in download or "/" in download):
        raise ConfigError(
            f"FLEET_S3_DOWNLOAD_ENDPOINT={download!r} must be host:port, as engine pods reach the "
            "store (same scheme as FLEET_S3_USE_SSL)"
        )
    return S3Settings(
        endpoint=endpoint,
        bucket=env.get("FLEET_S3_BUCKET", "").strip() or "fleet-weights",
        access_key=env.get("FLEET_S3_ACCESS_KEY", ""),
        secret_key=env.get("FLEET_S3_SECRET_KEY", ""),
        use_ssl=_flag(env, "FLEET_S3_USE_SSL", True),
        download_endpoint=download,
    )


def registry_settings(env: Mapping[str, str]) -> RegistrySettings:
    """The registry's settings from the environment (called once, by ``main``)."""
    if env.get("FLEET_SYNTHETIC_HUB", "").strip():
        raise ConfigError(
            "FLEET_SYNTHETIC_HUB is no longer read: the control plane serves no hub of its own; "
            "run `python -m fleet_core.devtools.hub` and set FLEET_HUB_URL to it (make dev does)"
        )
    hub_url = env.get("FLEET_HUB_URL", "").strip()
    return RegistrySettings(
        models_dir=env.get("FLEET_MODELS_DIR", "").strip() or RegistrySettings.models_dir,
        s3=_s3(env),
        hub_url=hub_url or DEFAULT_HUB_URL,
        hf_token=env.get("FLEET_HF_TOKEN", "").strip() or None,
        stall_timeout_s=_seconds(env, "FLEET_HUB_STALL_TIMEOUT_S", 30.0),
        resume_on_start=_flag(env, "FLEET_PULL_RESUME", True),
    )
