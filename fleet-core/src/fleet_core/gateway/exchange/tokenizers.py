"""Tokenizers from the model registry, for the gateway's own count (P6).

An upstream may name ``tokenizer: registry:<model id>`` in fleet.yaml instead of a file: the gateway
then fetches ``GET /api/v1/models/<id>/tokenizer`` from the control plane (FLEET_CONTROL_PLANE_URL)
in the background and counts with it once loaded. Until then — or while the model is not Ready —
requests are counted with the documented estimate, and their records say so
(``count_method``). A fetch that fails is retried every ``retry_s``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from urllib.parse import quote

import aiohttp

from fleet_core.gateway.metering.counting import Counter, counter_from_json
from fleet_core.shared import stopping

__all__ = ["REGISTRY_PREFIX", "RegistryTokenizers", "registry_id"]

log = logging.getLogger("fleet.gateway")
REGISTRY_PREFIX = "registry:"


def registry_id(tokenizer: str | None) -> str | None:
    """The registry model id of a ``registry:<id>`` tokenizer reference, else None."""
    if tokenizer and tokenizer.startswith(REGISTRY_PREFIX):
        return tokenizer.removeprefix(REGISTRY_PREFIX)
    return None


class RegistryTokenizers:
    def __init__(
        self, session: aiohttp.ClientSession, control_plane_url: str, *, token: str | None = None
    ) -> None:
        self._session = session
        self._base = control_plane_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._loaded: dict[str, Counter] = {}

    def get(self, model_id: str) -> Counter | None:
        return self._loaded.get(model_id)

    async def fetch(self, model_ids: Iterable[str]) -> None:
        """Load the tokenizers not loaded yet; failures are logged and left for the next round."""
        for model_id in sorted(set(model_ids) - self._loaded.keys()):
            url = f"{self._base}/api/v1/models/{quote(model_id, safe='')}/tokenizer"
            try:
                timeout = aiohttp.ClientTimeout(total=10)
                async with self._session.get(url, headers=self._headers, timeout=timeout) as r:
                    if r.status != 200:
                        log.warning("tokenizer of %s not available yet (%s)", model_id, r.status)
                        continue
                    text = await r.text()
                self._loaded[model_id] = counter_from_json(f"{REGISTRY_PREFIX}{model_id}", text)
                log.info("counting %s with its registry tokenizer", model_id)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.warning("could not load the tokenizer of %s: %s", model_id, exc)

    async def run(self, wanted: Callable[[], Iterable[str]], *, retry_s: float = 30.0) -> None:
        """Forever: fetch what the current routing table wants and is not loaded yet."""
        while True:
            await self.fetch(wanted())
            stopping.raise_if_cancelled()
            await asyncio.sleep(retry_s)
