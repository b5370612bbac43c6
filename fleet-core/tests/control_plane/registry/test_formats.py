"""The parsers refuse what is not a loadable file, with the reason, and read the facts right."""

from __future__ import annotations

import json
import struct

import pytest

from fleet_core.control_plane.registry import formats, verifying
from fleet_core.control_plane.registry.formats import Blob, FormatError
from fleet_core.devtools.hub import files


def blob(name: str, data: bytes) -> Blob:
    async def read(offset: int, length: int) -> bytes:
        return data[offset : offset + length]

    return Blob(name, len(data), read)


def safetensors(header: dict[str, object], data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


async def test_safetensors_facts() -> None:
    data = files.safetensors_bytes([("a", "BF16", (4, 4)), ("b", "F32", (2,))])
    parsed = await formats.parse_safetensors(blob("m.safetensors", data))
    assert (parsed.parameters, parsed.dtype) == (18, "BF16")
    assert await formats.sniff(blob("x", data)) == "safetensors"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"1234", "too short"),
        (struct.pack("<Q", 1 << 40) + b"{}", "does not fit"),
        (struct.pack("<Q", 4) + b"nope", "not JSON"),
        (safetensors({}, b""), "lists no tensors"),
        (safetensors({"t": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}, b"x"), "dtype"),
        (safetensors({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"x" * 4),
         "need 8"),
        (safetensors({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"x" * 4),
         "truncated"),
        (safetensors({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b""), "shape"),
        (safetensors({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b""),
         "data_offsets"),
    ],
)  # fmt: skip
async def test_bad_safetensors_are_refused_with_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(FormatError, match=reason):
        await formats.parse_safetensors(blob("m.safetensors", data))


async def test_gguf_facts() -> None:
    parsed = await formats.parse_gguf(blob("m.gguf", files.gguf_bytes(architecture="qwen2")))
    assert (parsed.architecture, parsed.quantization, parsed.version) == ("qwen2", "Q8_0", 3)
    assert parsed.parameters == 16 * len(files.WORDS) + 2 * 32 * 16


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda d: b"GGUX" + d[4:], "no GGUF magic"),
        (lambda d: d[:4] + struct.pack("<I", 9) + d[8:], "version 9"),
        (lambda d: d[:-64], "truncated"),
        (lambda d: d[:40], "past the end"),
        (lambda d: d[:8] + struct.pack("<Q", 1 << 40) + d[16:], "not a plausible"),
    ],
)
async def test_bad_gguf_is_refused_with_the_reason(mangle: object, reason: str) -> None:
    assert callable(mangle)
    with pytest.raises(FormatError, match=reason):
        await formats.parse_gguf(blob("m.gguf", mangle(files.gguf_bytes())))


def test_engine_fit_is_a_pure_rule() -> None:
    assert verifying.engine_fit("vllm", "safetensors") is None
    assert verifying.engine_fit("llamacpp", "gguf") is None
    refusal = verifying.engine_fit("vllm", "gguf", model="model 'x'")
    assert refusal is not None
    assert "serve it with llamacpp" in refusal
    assert "unknown engine" in (verifying.engine_fit("tgi", "gguf") or "")


async def test_safetensors_without_config_is_not_loadable() -> None:
    weights = blob("model.safetensors", files.safetensors_bytes([("a", "F32", (2,))]))
    with pytest.raises(FormatError, match=r"without a config\.json"):
        await verifying.model_facts([weights], {"model.safetensors": "x"}, requested=None)


async def test_a_repository_of_several_quantizations_has_the_facts_of_each() -> None:
    """With ``weightFile`` only one GGUF model is fetched and served, so its size
    is its own file's (a split model's, all its parts'), and the parameters are one model's, not
    a sum over every quantization the repository holds."""
    stored = {
        "m-Q8_0.gguf": files.gguf_bytes(seed=1),
        "m-Q4_K_M.gguf": files.gguf_bytes(seed=2, alignment=64),
        "m-F16-00001-of-00002.gguf": files.gguf_bytes(seed=3),
        "m-F16-00002-of-00002.gguf": files.gguf_bytes(seed=4, alignment=128),
        "README.md": b"# m",
    }
    one = await formats.parse_gguf(blob("m-Q8_0.gguf", stored["m-Q8_0.gguf"]))
    blobs = [blob(name, data) for name, data in stored.items()]
    facts = await verifying.model_facts(blobs, dict.fromkeys(stored, "x"), requested="gguf")
    sizes = {v.file: v.size_bytes for v in facts.variants}
    assert sizes == {
        "m-F16-00001-of-00002.gguf": len(stored["m-F16-00001-of-00002.gguf"])
        + len(stored["m-F16-00002-of-00002.gguf"]),
        "m-Q4_K_M.gguf": len(stored["m-Q4_K_M.gguf"]),
        "m-Q8_0.gguf": len(stored["m-Q8_0.gguf"]),
    }
    assert {v.file: v.parameters for v in facts.variants} == {
        "m-F16-00001-of-00002.gguf": 2 * one.parameters,
        "m-Q4_K_M.gguf": one.parameters,
        "m-Q8_0.gguf": one.parameters,
    }
    assert facts.size_bytes == sum(len(d) for d in stored.values())  # what is stored
    assert facts.parameters == facts.variants[0].parameters  # the first by name, as served
    assert facts.quantization is None  # several: each variant names its own


async def test_a_single_gguf_model_keeps_its_quantization_and_one_variant() -> None:
    data = files.gguf_bytes()
    facts = await verifying.model_facts([blob("m.gguf", data)], {"m.gguf": "x"}, requested=None)
    (variant,) = facts.variants
    assert (variant.file, variant.size_bytes, variant.quantization) == ("m.gguf", len(data), "Q8_0")
    assert (facts.quantization, facts.parameters) == ("Q8_0", variant.parameters)
