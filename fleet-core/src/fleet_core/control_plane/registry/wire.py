"""The model registry's API on the wire."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from fleet_contract import Engine, WeightFile, WeightFormat
from fleet_core.control_plane.rates.wire import RatesPut

__all__ = [
    "EngineFit",
    "GgufVariant",
    "HuggingFaceSource",
    "ImportFile",
    "ImportPlan",
    "LocalSource",
    "Model",
    "ModelCreate",
    "ModelFacts",
    "ModelPatch",
    "ModelStatus",
    "PullProgress",
    "Rates",
    "Source",
    "WeightFormat",
]

ModelStatus = Literal["Registered", "Pulling", "Ready", "Failed", "Cancelled"]
ModelId = Annotated[
    str,
    Meta(
        pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$",
        description="lowercase letters, digits, '.', '_' and '-'; at most 63",
    ),
]
RepoId = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$",
        description="owner/name on the hub",
    ),
]
Revision = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")]
RelativePath = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.+ -]*(/[A-Za-z0-9_][A-Za-z0-9_.+ -]*)*$",
        max_length=512,
        description="a relative path with '/' between segments; no segment starts with '.'",
    ),
]
Sha256 = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$", description="lowercase hex")]


class HuggingFaceSource(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    repo: RepoId
    revision: Revision = "main"
    """A branch, tag or commit; pinned to the commit at pull time."""


class LocalSource(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Weights a client uploads (``fleet models import``): no hub is asked for anything."""

    origin: Annotated[str, Meta(min_length=1, max_length=255)]
    """The name of the file or directory they came from, as the client saw it (shown only)."""


class Source(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """Exactly one of ``huggingface``, ``uri`` (``hf://owner/name[@revision]``) or ``local``."""

    huggingface: HuggingFaceSource | None = None
    uri: Annotated[str, Meta(max_length=400)] | None = None
    local: LocalSource | None = None


class ModelCreate(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    source: Source
    id: ModelId | None = None
    """Defaults to the repository's name, lowercased."""
    format: WeightFormat | None = None
    """What the files must contain; a pull whose files do not is Failed."""


class ImportFile(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    path: RelativePath
    size: Annotated[int, Meta(ge=0, le=1 << 44)]
    sha256: Sha256
    """What the client hashed before sending; the bytes that arrive must hash to it."""


class ImportPlan(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The files an import will upload (``POST /models/{id}/import``), one PUT each after."""

    files: Annotated[tuple[ImportFile, ...], Meta(min_length=1, max_length=10_000)]


class Rates(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Units per million tokens, the three sides budgets in units bill at (stored as integer
    micro-units per 1,000 tokens: these are exact to the three decimals they can have)."""

    input_fresh: float
    input_cached: float
    output: float


class ModelPatch(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    rates: RatesPut | None = None
    """Exact decimals, at most three of them (``/model-rates``' body)."""


class GgufVariant(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One GGUF model of a repository (a quantization, with its split parts): what a FleetModel
    naming ``file`` as its ``weightFile`` fetches and serves."""

    file: str
    """The name a FleetModel's ``weightFile`` gives: the file, or a split model's first part."""
    quantization: str
    parameters: int
    size_bytes: int
    """Every part of this model: what is fetched and served, not what the repository holds."""


class ModelFacts(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What verification found, by parsing the stored files."""

    format: WeightFormat
    architecture: str | None
    parameters: int
    """GGUF: the parameters of one model (the first variant), not a sum over quantizations."""
    size_bytes: int
    """Every stored file; a GGUF repository's served size is its variant's ``sizeBytes``."""
    dtype: str | None = None
    """safetensors: the dtype holding most parameters."""
    quantization: str | None = None
    """GGUF: the file type (Q8_0, Q4_K_M …) when the files hold one model; None with several."""
    variants: tuple[GgufVariant, ...] = ()
    """GGUF: each model the files hold, by ``file``, with what serving it fetches."""
    tokenizer: bool = False
    """A tokenizer.json is present (GET /models/{id}/tokenizer serves it)."""
    files: tuple[WeightFile, ...] = ()
    """Each stored file with its size and sha256: the contract's type, as the operator reads it
    from ``GET /models/{id}/weights``."""


class Model(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: str
    source: Source
    format: WeightFormat | None
    status: ModelStatus
    reason: str
    revision: str | None
    """The commit the pull pinned."""
    facts: ModelFacts | None
    rates: Rates | None
    created_at: datetime
    updated_at: datetime


class PullProgress(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    model: str
    status: ModelStatus
    reason: str
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    bytes_per_second: int
    eta_seconds: int | None
    current_file: str | None = None


class EngineFit(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    model: str
    engine: Engine
    format: WeightFormat
    fits: bool
    reason: str
