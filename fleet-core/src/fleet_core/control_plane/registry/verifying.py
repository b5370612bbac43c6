"""Ready means loadable: the stored files are parsed, and the model's facts come from what parsed.

Which files are weights is decided by their content (``formats.sniff``); a file whose name claims
one format while its bytes hold another fails, because engines find weights by name. ``engine_fit``
is the pure rule for where a FleetModel meets a model — vLLM takes safetensors, llama.cpp takes
GGUF — written so the operator side can mirror it line for line.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence

from fleet_contract import WeightFile, WeightFormat
from fleet_core.control_plane.registry import formats
from fleet_core.control_plane.registry.formats import Blob, FormatError
from fleet_core.control_plane.registry.wire import GgufVariant, ModelFacts

__all__ = ["ENGINE_FORMATS", "engine_fit", "model_facts"]

ENGINE_FORMATS: dict[str, WeightFormat] = {"vllm": "safetensors", "llamacpp": "gguf"}
_NOT_WEIGHTS = (".json", ".md", ".txt", ".py", ".model", ".jinja", ".gitattributes", ".yaml")
_SUFFIX_FORMAT: dict[str, WeightFormat] = {".safetensors": "safetensors", ".gguf": "gguf"}


def engine_fit(engine: str, weight_format: WeightFormat, *, model: str = "the model") -> str | None:
    """None when ``engine`` can load ``weight_format``; otherwise the refusal's reason."""
    wanted = ENGINE_FORMATS.get(engine)
    if wanted is None:
        return f"unknown engine {engine!r}; known: {', '.join(sorted(ENGINE_FORMATS))}"
    if wanted == weight_format:
        return None
    other = next(e for e, f in ENGINE_FORMATS.items() if f == weight_format)
    return (
        f"{engine} loads {wanted} weights, but {model} holds {weight_format} weights; "
        f"serve it with {other} or register a {wanted} repository"
    )


async def model_facts(
    blobs: Sequence[Blob],
    sha256: dict[str, str],
    *,
    requested: WeightFormat | None,
) -> ModelFacts:
    """The facts of a complete, hash-checked file set; ``FormatError`` with the reason if the
    files are not a loadable model of ``requested`` (or of any format, when None)."""
    found: dict[WeightFormat, list[Blob]] = {"safetensors": [], "gguf": []}
    for blob in blobs:
        kind = await _weight_kind(blob)
        if kind is not None:
            found[kind].append(blob)
    chosen = _choose(found, requested)
    files = tuple(WeightFile(path=b.name, size=b.size, sha256=sha256[b.name]) for b in blobs)
    names = {b.name for b in blobs}
    common = {
        "size_bytes": sum(b.size for b in blobs),
        "tokenizer": "tokenizer.json" in names,
        "files": files,
    }
    if chosen == "gguf":
        return await _gguf(found["gguf"], common)
    return await _safetensors(found["safetensors"], blobs, common)


async def _weight_kind(blob: Blob) -> WeightFormat | None:
    if blob.name.lower().endswith(_NOT_WEIGHTS) or blob.size < 9:
        return None
    sniffed = await formats.sniff(blob)
    named = next((f for s, f in _SUFFIX_FORMAT.items() if blob.name.lower().endswith(s)), None)
    if named is not None and sniffed != named:
        holds = sniffed or "neither safetensors nor GGUF"
        raise FormatError(f"{blob.name} is named as {named} but its bytes hold {holds}")
    return "gguf" if sniffed == "gguf" else ("safetensors" if sniffed else None)


def _choose(found: dict[WeightFormat, list[Blob]], requested: WeightFormat | None) -> WeightFormat:
    present: list[WeightFormat] = [f for f in ("safetensors", "gguf") if found[f]]
    if not present:
        raise FormatError("no file holds safetensors or GGUF weights")
    if requested is not None and requested not in present:
        raise FormatError(
            f"format {requested} was asked for, but the files hold {' and '.join(present)}"
        )
    chosen: WeightFormat = requested or present[0]
    return chosen


async def _safetensors(
    weights: list[Blob], blobs: Sequence[Blob], common: dict[str, object]
) -> ModelFacts:
    by_dtype: Counter[str] = Counter()
    for blob in weights:
        parsed = await formats.parse_safetensors(blob)
        by_dtype[parsed.dtype] += parsed.parameters
    config = next((b for b in blobs if b.name == "config.json"), None)
    if config is None:
        raise FormatError("safetensors weights without a config.json cannot be loaded")
    return ModelFacts(
        format="safetensors",
        architecture=await _architecture(config),
        parameters=sum(by_dtype.values()),
        dtype=by_dtype.most_common(1)[0][0],
        **common,  # type: ignore[arg-type]
    )


async def _architecture(config: Blob) -> str | None:
    if config.size > 4 << 20:
        raise FormatError(f"config.json is {config.size} bytes, too large to be a model config")
    try:
        body = json.loads(await config.read(0, config.size))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"config.json is not JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise FormatError("config.json is not a JSON object")
    architectures = body.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0]
    model_type = body.get("model_type")
    return model_type if isinstance(model_type, str) else None


async def _gguf(weights: list[Blob], common: dict[str, object]) -> ModelFacts:
    """A repository may hold several quantizations, each perhaps split in parts: the facts of
    each (a FleetModel's ``weightFile`` picks one), and of the first for the model's own."""
    parts: dict[str, list[tuple[Blob, formats.GgufFacts]]] = {}
    for blob in sorted(weights, key=lambda b: b.name):
        parts.setdefault(_gguf_model(blob.name), []).append((blob, await formats.parse_gguf(blob)))
    variants = tuple(
        GgufVariant(
            file=found[0][0].name,
            quantization=found[0][1].quantization,
            parameters=sum(facts.parameters for _, facts in found),
            size_bytes=sum(blob.size for blob, _ in found),
        )
        for found in parts.values()
    )
    first = next(iter(parts.values()))[0][1]
    return ModelFacts(
        format="gguf",
        architecture=first.architecture,
        parameters=variants[0].parameters,
        quantization=variants[0].quantization if len(variants) == 1 else None,
        variants=variants,
        **common,  # type: ignore[arg-type]
    )


_SPLIT = re.compile(r"-[0-9]{5}-of-[0-9]{5}\.gguf$")


def _gguf_model(name: str) -> str:
    """The model a GGUF file belongs to: its name without a split suffix (as llama.cpp's
    ``gguf-split`` writes ``-00001-of-00003.gguf``), so a model's parts are counted together."""
    return _SPLIT.sub("", name).removesuffix(".gguf")
