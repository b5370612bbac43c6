"""Reading a registry model's weights from the control plane (``GET /api/v1/models/{id}/weights``).

The answer is the contract's :class:`fleet_contract.ModelWeights`. Anything that stops the files
from being fetchable right now (the model is unknown, still pulling, failed, or the control plane
is unreachable) is :class:`WeightsUnavailable`, whose message the FleetModel's status shows while
the operator waits and retries.
"""

from __future__ import annotations

from urllib.parse import quote

import aiohttp

from fleet_contract import ContractError, ModelWeights, decode_weights
from fleet_serving.credentials import TokenFile
from fleet_serving.errors import FleetServingError
from fleet_serving.sources import RegistryWeights

__all__ = ["WeightsClient", "WeightsUnavailable"]


class WeightsUnavailable(FleetServingError):
    """The registry model's files cannot be fetched yet; the message says why."""


class WeightsClient:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        control_plane: str,
        *,
        token: TokenFile | None = None,
        engine_token_secret: str = "fleet-engine-token",
        timeout: float = 10,
    ):
        self._session = session
        self._base = control_plane.rstrip("/")
        self._token = token
        self._engine_secret = engine_token_secret
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def resolve(self, model_id: str) -> RegistryWeights:
        """The Ready model with its files, or WeightsUnavailable."""
        url = f"{self._base}/api/v1/models/{quote(model_id, safe='')}/weights"
        headers = self._token.headers() if self._token is not None else {}
        try:
            async with self._session.get(url, headers=headers, timeout=self._timeout) as response:
                body = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise WeightsUnavailable(
                f"cannot ask the control plane about registry model {model_id!r}: "
                f"{type(exc).__name__} {exc}".rstrip()
            ) from exc
        if status == 404:
            raise WeightsUnavailable(
                f"registry model {model_id!r} does not exist; register and pull it "
                f"(fleet models pull hf://<owner>/<repo>)"
            )
        if status in (401, 403):
            raise WeightsUnavailable(
                f"the control plane refused the operator's credential ({status}) reading registry "
                f"model {model_id!r}: check --report-token-file"
            )
        if status != 200:
            raise WeightsUnavailable(
                f"the control plane answered {status} for registry model {model_id!r}"
            )
        try:
            weights: ModelWeights = decode_weights(body)
        except ContractError as exc:
            raise WeightsUnavailable(f"unreadable weights for {model_id!r}: {exc}") from exc
        if not weights.ready:
            why = f": {weights.reason}" if weights.reason else ""
            raise WeightsUnavailable(
                f"registry model {model_id!r} is {weights.status}{why}; the engine starts once "
                f"it is Ready"
            )
        return RegistryWeights(
            control_plane=self._base, weights=weights, token_secret=self._engine_secret
        )
