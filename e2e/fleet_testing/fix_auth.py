"""The control plane's bootstrap admin token, for every test that starts one.

Each test gets a fresh random token (as ``make dev`` makes one under ``.dev/``): pass it as
``ApiserverSettings(admin_token=…)`` or ``FLEET_ADMIN_TOKEN`` to a process, and send
``admin_headers`` (its bearer header, plus ``Content-Type: application/json`` that every write
needs) with the HTTP client.
"""

from __future__ import annotations

import secrets

import pytest

__all__ = ["admin_headers", "admin_token", "bearer"]


def bearer(token: str) -> dict[str, str]:
    """The headers of a JSON client carrying ``token``."""
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


@pytest.fixture
def admin_token() -> str:
    return "test-admin-" + secrets.token_urlsafe(32)


@pytest.fixture
def admin_headers(admin_token: str) -> dict[str, str]:
    return bearer(admin_token)
