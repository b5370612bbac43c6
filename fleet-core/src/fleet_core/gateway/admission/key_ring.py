"""API keys: ``tenant/project/keyid``, the whole string being the bearer credential.

Keys carry no limits (a key rotates and leaks; a budget tied to one would leak with it): limits
belong to tenants and projects (``policy``). Only SHA-256 digests of keys are kept in memory, and
a presented key is looked up by its digest, so the time a lookup takes says nothing about how much
of a secret matched (the timing attack a plain string comparison invites). What leaves
this module is a ``Principal`` whose ``key_id`` is a fingerprint of the digest, never the key or
its third segment (which together with tenant and project would be the key).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import msgspec

from fleet_core.shared.credentials import bearer_token, digest
from fleet_core.shared.errors import AuthenticationError, ConfigError

__all__ = ["ANONYMOUS", "KeyRing", "Principal", "parse_keys"]

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class Principal(msgspec.Struct, frozen=True, cache_hash=True):  # dict keys per request
    tenant: str
    project: str
    key_id: str
    """A fingerprint (``k_`` + 12 hex digits of the key's SHA-256), safe for logs and records."""


ANONYMOUS = Principal("anonymous", "none", "none")


class KeyRing:
    def __init__(self, keys: Iterable[str]) -> None:
        self._by_digest: dict[bytes, Principal] = {}
        for key in keys:
            tenant, project, _ = key.split("/")
            found = digest(key)
            self._by_digest[found] = Principal(tenant, project, "k_" + found.hex()[:12])

    def __len__(self) -> int:
        return len(self._by_digest)

    def lookup(self, secret: str) -> Principal | None:
        # A dict lookup on the digest: its timing depends on the digest, which an attacker
        # cannot steer towards a real key's, not on how many leading characters were right.
        return self._by_digest.get(digest(secret))

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal behind an ``Authorization: Bearer`` header, or 401."""
        principal = self.lookup(bearer_token(authorization))
        if principal is None:
            raise AuthenticationError("Incorrect API key provided.")
        return principal


def parse_keys(spec: str) -> list[str]:
    """``FLEET_API_KEYS``: ``tenant/project/keyid`` separated by ``;``. Raises ConfigError."""
    keys = [part.strip() for part in spec.split(";") if part.strip()]
    for index, key in enumerate(keys):
        where = f"FLEET_API_KEYS entry {index + 1}"
        if "|" in key:
            raise ConfigError(
                f"{where} carries limits ('|rpm=...'); keys carry no limits any more: declare "
                "them per tenant in FLEET_RATE_TENANTS and per project in FLEET_RATE_PROJECTS"
            )
        segments = key.split("/")
        if len(segments) != 3 or not all(_SEGMENT.match(s) for s in segments):
            raise ConfigError(
                f"{where} is not tenant/project/keyid (letters, digits, '.', '_', '-'); "
                "separate keys with ';'"
            )
    if len(set(keys)) != len(keys):
        raise ConfigError("FLEET_API_KEYS lists the same key twice; remove the duplicate")
    return keys
