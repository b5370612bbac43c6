"""The operator's control-plane credential, read from a file (a mounted Secret) at each use.

Reading it each time makes rotation a Secret update: the kubelet refreshes the mounted file and
the next request carries the new token, with no restart. The token never reaches a log line,
argv or the settings' repr; only the file's path does.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from fleet_serving.errors import ConfigError

__all__ = ["TokenFile"]


class TokenFile(msgspec.Struct, kw_only=True, frozen=True):
    path: str
    """A file whose first line is the token (``--report-token-file``)."""

    def check(self) -> None:
        """ConfigError, in one line, when the file cannot serve: at start, not at first use."""
        if not self.read():
            raise ConfigError(
                f"--report-token-file {self.path} is missing, unreadable or empty: mount the "
                "operator credential's Secret there (docs/security.md)"
            )

    def read(self) -> str:
        try:
            lines = Path(self.path).read_text("utf-8").strip().splitlines()
        except (OSError, UnicodeDecodeError):
            return ""
        return lines[0].strip() if lines else ""

    def headers(self) -> dict[str, str]:
        """The Authorization header (none when the file went away: the control plane says 401)."""
        token = self.read()
        return {"Authorization": f"Bearer {token}"} if token else {}
