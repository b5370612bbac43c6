"""Where the console's files live and where its control-plane calls go."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BUILT_DIR", "ConsoleSettings", "console_from_env"]

BUILT_DIR = Path(__file__).parent / "static"
"""``make web`` builds ``web/`` here (package data, never committed)."""


@dataclass(frozen=True)
class ConsoleSettings:
    static_dir: Path = BUILT_DIR
    """The built console: index.html and assets/ (FLEET_CONSOLE_DIR); missing: a placeholder
    page says how to build it."""
    api_url: str | None = field(default=None)
    """The control plane the console's ``/api/v1`` calls are passed to (FLEET_CONSOLE_API_URL).
    Unset: none — a gateway behind a public Ingress does not open the control plane's API to the
    internet unless told to — and the console offers the playground and fleet pages only."""


def console_from_env(env: Mapping[str, str]) -> ConsoleSettings:
    api_url = env.get("FLEET_CONSOLE_API_URL") or None
    static_dir = env.get("FLEET_CONSOLE_DIR")
    return ConsoleSettings(
        static_dir=Path(static_dir) if static_dir else BUILT_DIR,
        api_url=api_url.rstrip("/") if api_url else None,
    )
