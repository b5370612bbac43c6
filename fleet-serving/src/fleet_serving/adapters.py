"""LoRA adapters of a FleetModel: which names they take, which files, which engine flags.

A FleetModel lists adapters (``spec.adapters``), each a model name of its own with weights in
Fleet's registry. Every replica loads all of them beside the base model; clients pick one by
sending its name as ``model``, and the gateway routes that name to the base's endpoints and bills
under it (ADR 0028). The engines differ in how a request selects an adapter:

- vLLM serves each adapter as a model of its own (``--enable-lora --lora-modules name=path``):
  the gateway forwards the adapter's name and vLLM does the rest.
- llama.cpp's ``llama-server`` loads them with ``--lora path`` (in spec order: the first is id 0)
  and, with ``--lora-init-without-apply``, applies none by default; the gateway selects one per
  request with the body's ``lora: [{"id": i, "scale": 1.0}]`` field, so a request for the base
  name stays unadapted. The order of ``spec.adapters`` is therefore the ids' order, and the
  inventory report lists the names in that order (``ModelDeployment.adapters``).

Pure functions only; resolving the registry ids is the handlers' (``fleet_serving.handlers``).
The files go to ``/models/adapters/<index>/``, a folder per adapter by position: a name may hold
``/`` or ``.``, which should not become paths.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from fleet_contract import Engine, ModelWeights
from fleet_serving import sources
from fleet_serving.errors import InvalidSpec
from fleet_serving.sources import RegistryWeights
from fleet_serving.spec import FleetModelSpec

__all__ = [
    "ADAPTER_DIR",
    "VLLM_DEFAULT_RANK",
    "VLLM_RANKS",
    "ResolvedAdapter",
    "check",
    "check_weights",
    "engine_args",
    "fetch_args",
    "names",
]

ADAPTER_DIR = "adapters"
"""Below the model volume: ``/models/adapters/<index>/``."""
VLLM_DEFAULT_RANK = 16
"""vLLM's own ``--max-lora-rank``: an adapter of a higher rank needs the flag raised."""
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``--max-lora-rank``."""


class ResolvedAdapter(msgspec.Struct, kw_only=True, frozen=True):
    """An adapter of the spec with its registry model resolved (Ready, files and hashes)."""

    name: str
    index: int
    """Its position in ``spec.adapters``: its folder, and llama-server's id for it."""
    registry: RegistryWeights

    @property
    def folder(self) -> str:
        return f"{ADAPTER_DIR}/{self.index}"


def names(spec: FleetModelSpec) -> tuple[str, ...]:
    """The adapters' model names, in spec order (the inventory report's ``adapters``)."""
    return tuple(a.name for a in spec.adapters)


def check(spec: FleetModelSpec) -> None:
    """InvalidSpec when the adapters cannot be served as listed: a name taken twice, or taken by
    the base model (the CRD's rule says the same; this catches objects made without it). Their
    number and names are bounded by the spec's types (`spec.MAX_ADAPTERS`)."""
    seen: set[str] = set()
    for i, adapter in enumerate(spec.adapters):
        if adapter.name == spec.served_model_name:
            raise InvalidSpec(
                f"spec.adapters[{i}].name {adapter.name!r} is the base model's servedModelName:"
                " an adapter needs a model name of its own"
            )
        if adapter.name in seen:
            raise InvalidSpec(f"spec.adapters[{i}].name {adapter.name!r} is listed twice")
        seen.add(adapter.name)


def check_weights(engine: Engine, name: str, weights: ModelWeights) -> None:
    """InvalidSpec when a Ready registry model cannot be this engine's adapter: llama.cpp loads
    one GGUF file, vLLM a PEFT folder (``adapter_config.json`` beside the weights)."""
    where = f"adapter {name!r}: registry model {weights.model_id!r}"
    for file in weights.files:
        if file.path.startswith("/") or ".." in file.path.split("/"):
            raise InvalidSpec(f"{where} lists a file outside its folder: {file.path!r}")
    paths = sorted(f.path for f in weights.files)
    if engine == "llamacpp":
        ggufs = [p for p in paths if p.endswith(".gguf")]
        if len(ggufs) != 1:
            raise InvalidSpec(f"{where} holds {len(ggufs)} .gguf files; a LoRA adapter is one")
        if "," in ggufs[0]:
            raise InvalidSpec(f"{where}: llama-server splits --lora on ',': {ggufs[0]!r}")
    elif "adapter_config.json" not in paths:
        raise InvalidSpec(f"{where} has no adapter_config.json (a PEFT LoRA folder)")


def _vllm_rank(spec: FleetModelSpec) -> int | None:
    """``--max-lora-rank``: the smallest value vLLM accepts that holds every adapter's rank,
    when above its default; None when the default holds them all."""
    highest = max((a.rank or 0 for a in spec.adapters), default=0)
    if highest <= VLLM_DEFAULT_RANK:
        return None
    return next(r for r in VLLM_RANKS if r >= highest)


def engine_args(
    spec: FleetModelSpec, resolved: Sequence[ResolvedAdapter], *, model_dir: str
) -> list[str]:
    """The engine flags that load the adapters (none without adapters)."""
    if not resolved:
        return []
    if spec.engine == "vllm":
        args = ["--enable-lora", "--max-loras", str(len(resolved)), "--lora-modules"]
        args += [f"{a.name}={model_dir}/{a.folder}" for a in resolved]
        rank = _vllm_rank(spec)
        return args + (["--max-lora-rank", str(rank)] if rank is not None else [])
    args = []
    for adapter in sorted(resolved, key=lambda a: a.index):  # llama-server's ids: this order
        file = sources.gguf_file(adapter.registry.weights)
        args += ["--lora", f"{model_dir}/{adapter.folder}/{file}"]
    return [*args, "--lora-init-without-apply"]


def fetch_args(resolved: Sequence[ResolvedAdapter]) -> list[str]:
    """The fetch script's (path, url, sha256) triples for every adapter file, each below its
    adapter's folder (`sources.FETCH_SCRIPT`)."""
    args: list[str] = []
    for adapter in resolved:
        for file in sorted(adapter.registry.weights.files, key=lambda f: f.path):
            url = adapter.registry.file_url(file.path)
            args += [f"{adapter.folder}/{file.path}", url, file.sha256]
    return args
