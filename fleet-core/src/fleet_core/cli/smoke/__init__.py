"""``fleet smoke``: one command that proves a running Fleet works end to end.

It talks to a gateway and a control plane over HTTP only (never a shell on the servers), makes what
it needs under throwaway tenants it deactivates afterwards, and prints one line per check with the
area, what is checked, ``ok``/``FAIL`` and the value it saw. docs/smoke.md lists every check and
what it protects. One module per area; ``running`` prints and counts, ``cli`` parses and runs.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """``fleet smoke ...`` (imported lazily so ``fleet models`` pays nothing for it)."""
    from fleet_core.cli.smoke.cli import main as run

    run(argv)
