"""The operator's own exceptions, one base class, so callers can catch what this package raises.

::

    FleetServingError
    ├── InvalidSpec          a FleetModel that can never run as written (permanent)
    │   └── Rejected         the API server refused an object rendered from it (4xx, not 409/429)
    ├── ConfigError          a command line or environment that cannot work (refuse to start)
    ├── ForeignObject        an object the operator would make exists and is not its own
    └── KubernetesError      the API answered with an error (temporary unless 4xx-permanent)
        └── Conflict         409: someone else changed or created the object first

Kubernetes client exceptions are translated into these only in :mod:`fleet_serving.kube`, the one
module that talks to the API; handlers turn them into ``kopf.TemporaryError`` /
``kopf.PermanentError``.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "Conflict",
    "FleetServingError",
    "ForeignObject",
    "InvalidSpec",
    "KubernetesError",
    "Rejected",
]


class FleetServingError(Exception):
    """Base of every error fleet_serving raises on purpose."""


class InvalidSpec(FleetServingError):
    """The spec cannot run as written; the message is shown in the FleetModel's status."""


class Rejected(InvalidSpec):
    """The API server answered 4xx (other than 404, 409 and 429) to an object rendered from the
    spec: retrying the same object cannot help; the message, the server's, goes to the status."""


class ForeignObject(FleetServingError):
    """An object of the name the operator renders exists without this FleetModel as its
    controller: it is never adopted or patched (the garbage collector would delete it with the
    FleetModel); the status names it until it is removed or renamed."""


class ConfigError(FleetServingError):
    """The operator's configuration cannot work; the message says what to change."""


class KubernetesError(FleetServingError):
    """The Kubernetes API refused or failed a request."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status

    @property
    def retryable(self) -> bool:
        """Conflicts, throttling, a missing parent (404: a namespace not there yet or any more)
        and server-side failures may heal by themselves; any other 4xx will not."""
        return self.status in (0, 404, 409, 429) or self.status >= 500


class Conflict(KubernetesError):
    """409 Conflict: the object changed under us or already exists."""
