"""The operator's own exceptions, one base class, so callers can catch what this package raises.

::

    FleetServingError
    ├── InvalidSpec          a FleetModel that can never run as written (permanent)
    ├── ConfigError          a command line or environment that cannot work (refuse to start)
    └── KubernetesError      the API answered with an error (temporary unless 4xx-permanent)
        └── Conflict         409: someone else changed or created the object first

Kubernetes client exceptions are translated into these only in :mod:`fleet_serving.kube`, the one
module that talks to the API; handlers turn them into ``kopf.TemporaryError`` /
``kopf.PermanentError``.
"""

from __future__ import annotations

__all__ = ["ConfigError", "Conflict", "FleetServingError", "InvalidSpec", "KubernetesError"]


class FleetServingError(Exception):
    """Base of every error fleet_serving raises on purpose."""


class InvalidSpec(FleetServingError):
    """The spec cannot run as written; the message is shown in the FleetModel's status."""


class ConfigError(FleetServingError):
    """The operator's configuration cannot work; the message says what to change."""


class KubernetesError(FleetServingError):
    """The Kubernetes API refused or failed a request."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status

    @property
    def retryable(self) -> bool:
        """Conflicts, throttling, and server-side failures may heal by themselves."""
        return self.status in (0, 409, 429) or self.status >= 500


class Conflict(KubernetesError):
    """409 Conflict: the object changed under us or already exists."""
