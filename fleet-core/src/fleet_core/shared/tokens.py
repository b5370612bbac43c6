"""Bearer secrets from the environment: a variable, or a file named by ``<VARIABLE>_FILE``.

A file is how Kubernetes hands a Secret to a container without putting it in the pod spec's
environment; a variable is handy on a laptop. Setting both, an unreadable file or a short token is
a configuration that cannot work, refused with one line. Clients (``make seed``, ``fleet``) find
their token the same way, falling back to the one ``make dev`` writes under ``.dev/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fleet_core.shared.errors import ConfigError

__all__ = ["DEV_ADMIN_TOKEN", "MIN_LENGTH", "bearer", "client_token", "secret_from_env"]

MIN_LENGTH = 32
DEV_ADMIN_TOKEN = Path(".dev") / "admin-token"
"""Where ``make dev`` keeps its admin token, relative to the checkout."""


def secret_from_env(env: Mapping[str, str], name: str) -> str | None:
    """``name``'s value, or the first line of the file ``name + "_FILE"`` names; None if unset."""
    value, path = env.get(name, "").strip(), env.get(f"{name}_FILE", "").strip()
    if value and path:
        raise ConfigError(f"both {name} and {name}_FILE are set: keep one")
    if path:
        value = _read(Path(path), name=f"{name}_FILE")
    if value and len(value) < MIN_LENGTH:
        raise ConfigError(
            f"{name} is shorter than {MIN_LENGTH} characters: use a random one, e.g. "
            "`openssl rand -hex 32`"
        )
    return value or None


def _read(path: Path, *, name: str) -> str:
    try:
        lines = path.read_text("utf-8").strip().splitlines()
    except OSError as exc:
        raise ConfigError(f"{name}={path} cannot be read: {exc.strerror}") from exc
    if not lines:
        raise ConfigError(f"{name}={path} is empty: write the token into it")
    return lines[0].strip()


def client_token(env: Mapping[str, str], *, cwd: Path | None = None) -> str | None:
    """A client's token: FLEET_TOKEN or FLEET_TOKEN_FILE, else ``make dev``'s admin token."""
    given = secret_from_env(env, "FLEET_TOKEN")
    if given is not None:
        return given
    dev = (cwd or Path.cwd()) / DEV_ADMIN_TOKEN
    return _read(dev, name="make dev's token") if dev.is_file() else None


def bearer(token: str | None) -> dict[str, str]:
    """The Authorization header carrying ``token``, or none."""
    return {"Authorization": f"Bearer {token}"} if token else {}
