"""``make seed``: a demo tenant, project, API key, budget rule and model rates, through the API.

Talks to the control plane at FLEET_SEED_API (default http://127.0.0.1:8081, where ``make dev``
runs it) like any client would, so it also works against a deployed control plane. It
authenticates with FLEET_TOKEN (or FLEET_TOKEN_FILE), else the admin token ``make dev`` keeps in
``.dev/admin-token``. Running it again keeps what exists and issues a fresh key (a key's secret
is shown once, when it is made).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from fleet_core.shared.errors import ConfigError
from fleet_core.shared.tokens import bearer, client_token

__all__ = ["main"]

TENANT = "demo"
PROJECT = "demo/default"
RATES = {
    "Qwen/Qwen2.5-7B-Instruct": {"inputFresh": 200, "inputCached": 20, "output": 800},
    "gemma-3-270m": {"inputFresh": 20, "inputCached": 2, "output": 80},
}


class SeedError(Exception):
    pass


def _call(
    api: str, method: str, path: str, body: dict[str, Any] | None = None, *, token: str | None
) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **bearer(token)}
    request = urllib.request.Request(f"{api}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        with exc:  # it holds the response's socket
            if exc.code == 409:
                return None  # already there
            detail = json.load(exc).get("error", {}).get("message", exc.reason)
            if exc.code == 401:
                detail += (
                    " (run `make seed` from the checkout `make dev` runs in, or set FLEET_TOKEN)"
                )
        raise SeedError(f"{method} {path}: {exc.code} {detail}") from None
    except OSError as exc:
        raise SeedError(
            f"cannot reach the control plane at {api} ({exc}); start it with `make dev` or set "
            "FLEET_SEED_API"
        ) from None


def _has_rule(call: Callable[[str, str], Any]) -> bool:
    """Whether the demo tenant has a budget rule, following the list's pages (ADR 0015)."""
    after = ""
    while True:
        listed = call("GET", f"/api/v1/budget-rules?limit=500{after}")
        if any(r["scopeId"] == TENANT for r in listed["data"]):
            return True
        if "next" not in listed:
            return False
        after = f"&after={listed['next']}"


def seed(api: str, token: str | None) -> str:
    def call(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return _call(api, method, path, body, token=token)

    call("POST", "/api/v1/tenants", {"id": TENANT, "name": "Demo", "requestLimit": 600})
    call("POST", "/api/v1/projects", {"tenantId": TENANT, "name": "default"})
    if not _has_rule(call):
        call(
            "POST",
            "/api/v1/budget-rules",
            {
                "scopeKind": "tenant",
                "scopeId": TENANT,
                "dimension": "tokens_total",
                "limit": 1_000_000,
                "window": "1d",
            },
        )
    for model, rates in RATES.items():
        call("PUT", f"/api/v1/model-rates/{model}", rates)
    issued = call("POST", "/api/v1/keys", {"projectId": PROJECT, "label": "make seed"})
    secret: str = issued["secret"]
    return secret


def main() -> None:
    api = os.environ.get("FLEET_SEED_API", "http://127.0.0.1:8081").rstrip("/")
    try:
        secret = seed(api, client_token(os.environ))
    except (SeedError, ConfigError) as exc:
        print(f"make seed: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print(
        f"""Seeded tenant {TENANT!r}, project {PROJECT!r}, a 1M tokens/day budget rule and rates.
API key (shown once): {secret}
  export KEY={secret}
  curl -s http://127.0.0.1:8080/v1/chat/completions -H "Authorization: Bearer $KEY" \\
    -H 'content-type: application/json' \\
    -d '{{"model": "qwen", "messages": [{{"role": "user", "content": "hello"}}]}}'"""
    )


if __name__ == "__main__":
    main()
