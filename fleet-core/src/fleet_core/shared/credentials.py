"""How a bearer secret is recognised and stored, the same in both servers.

Tenants' API keys (``fk_…``) and the control plane's service credentials (``fsc_…``) are kept
only as the SHA-256 of the secret, plus a short display prefix for people to tell them apart. The
control plane issues both; the gateway looks presented keys up by the same digest, so the rule
lives here, once. A lookup by digest also keeps a timing attack from learning how much of a secret
matched.
"""

from __future__ import annotations

import hashlib

from fleet_core.shared.errors import AuthenticationError

__all__ = [
    "API_KEY_PREFIX",
    "DISPLAY_PREFIX_LENGTH",
    "SERVICE_CREDENTIAL_PREFIX",
    "bearer_token",
    "digest",
]

API_KEY_PREFIX = "fk_"
"""A tenant's API key as the control plane issues it."""
SERVICE_CREDENTIAL_PREFIX = "fsc_"
"""A control-plane credential (admin, finance, operator, engine, gateway, metrics)."""
DISPLAY_PREFIX_LENGTH = 8
"""How much of a secret is kept in the clear, to recognise it in a list."""


def digest(secret: str) -> bytes:
    """SHA-256 of a secret: what every store keeps and looks credentials up by."""
    return hashlib.sha256(secret.encode("utf-8")).digest()


def bearer_token(authorization: str | None) -> str:
    """The credential of an ``Authorization: Bearer`` header, or 401."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationError("Missing API key: send it as 'Authorization: Bearer <key>'.")
    return token.strip()
