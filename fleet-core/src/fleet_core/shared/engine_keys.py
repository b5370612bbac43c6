"""Per-cluster engine keys, derived from the fleet's engine secret (ADR 0020).

The gateway holds the fleet engine secret (FLEET_ENGINE_KEY_FILE); each cluster's engines are
started with that cluster's key, ``HMAC-SHA256(secret, cluster id)`` in hex, which is what the
cluster's ``fleet-engine-key`` Secrets hold. So the gateway sends cluster c1's key only to the
endpoints c1's binding admitted, and whoever holds c1's key (its operator, its engines, anyone
who reads its Secrets) opens c1's engines and no other cluster's. A deployment derives a key with
the standard library, the secret on stdin rather than argv (deploy/install.sh)::

    python3 -c 'import hashlib, hmac, sys
    print(hmac.new(sys.stdin.read().encode(), sys.argv[1].encode(), hashlib.sha256).hexdigest())' c1
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["cluster_key"]


def cluster_key(secret: str, cluster_id: str) -> str:
    """The engine key of ``cluster_id``'s engines; empty when there is no secret."""
    if not secret:
        return ""
    return hmac.new(secret.encode(), cluster_id.encode(), hashlib.sha256).hexdigest()
