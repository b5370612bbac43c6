"""A registry model's weights: what fleet-serving reads to fetch them, as fleet-core serves them.

fleet-core answers ``GET /api/v1/models/{id}/weights`` with a :class:`ModelWeights`; fleet-serving
reads it for a FleetModel whose source is ``registry: <id>`` and, once ``status`` is ``Ready``,
renders an init container that downloads each file from
``GET /api/v1/models/{id}/files/{name}`` and checks its sha256 before the engine starts.

The same evolution rules as the inventory report apply (ADR 0001): new fields get a default,
unknown fields are ignored on decode, and no enum value is added within a major (so ``status`` is
a plain string: the registry's states may grow, and a reader treats any but ``Ready`` as not yet).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from fleet_contract.codec import decoded
from fleet_contract.inventory import Name, NonNegative, WeightFormat

__all__ = [
    "ModelWeights",
    "WeightFile",
    "decode_weights",
    "encode_weights",
    "weights_schema",
]

Sha256 = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")]


class WeightFile(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """One stored file of a model, as verified when it was pulled."""

    path: Name
    """Relative path within the model (may contain ``/``); the download URL's last segment(s)."""
    size: NonNegative
    sha256: Sha256


class ModelWeights(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """Where a registry model stands, and its files once it is Ready."""

    model_id: Name
    status: Name
    """The registry's state: ``Ready`` means every file is stored and verified; any other value
    (``Registered``, ``Pulling``, ``Failed``, …) means the files cannot be fetched yet."""
    reason: str | None = None
    """Why the model is not Ready, when the registry knows (a failed pull's message)."""
    format: WeightFormat | None = None
    """What the files hold; known once Ready."""
    files: tuple[WeightFile, ...] = ()
    """Every file, empty until Ready."""

    @property
    def ready(self) -> bool:
        return self.status == "Ready"


_decoder = msgspec.json.Decoder(ModelWeights)
_encoder = msgspec.json.Encoder()


def decode_weights(data: bytes | str) -> ModelWeights:
    """Decode and validate; unknown fields are ignored, wrong types name their path."""
    return decoded(_decoder, data)


def encode_weights(weights: ModelWeights) -> bytes:
    return _encoder.encode(weights)


def weights_schema() -> dict[str, Any]:
    """The JSON Schema of the current weights types, as snapshotted in ``contract/schemas/``."""
    return msgspec.json.schema(ModelWeights)
