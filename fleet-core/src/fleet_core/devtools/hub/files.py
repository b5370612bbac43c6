"""Real files of each weight format, generated: a synthetic repository must parse like a real one.

The registry verifies by parsing, so the synthetic hub cannot serve placeholder bytes: these are a
valid safetensors file (header JSON, aligned, tiny tensors), a valid GGUF v3 file (metadata, tensor
infos, aligned data) and a ``tokenizers`` WordLevel tokenizer the gateway can load.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator, Sequence

from tokenizers import Tokenizer, models, pre_tokenizers

__all__ = [
    "config_json",
    "gguf_bytes",
    "safetensors_bytes",
    "safetensors_head",
    "tiled",
    "tokenizer_json",
]

_VOCABULARY = (
    "[UNK] the a fleet model token is of and to in that it for on with as was at by be this "
    "from or an are not have but you they we can all one will there would what so up out if"
)
WORDS = tuple(_VOCABULARY.split(" "))

_DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2}


def _pattern(size: int, seed: int) -> bytes:
    """Deterministic, incompressible-looking bytes (a hash chain), so files differ by content."""
    out = bytearray()
    block = seed.to_bytes(8, "little")
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:size])


def safetensors_bytes(
    tensors: Sequence[tuple[str, str, tuple[int, ...]]], *, seed: int = 1
) -> bytes:
    """``tensors``: (name, dtype, shape) → a safetensors file with deterministic data."""
    head, size = safetensors_head(tensors)
    return head + _pattern(size, seed)


def safetensors_head(tensors: Sequence[tuple[str, str, tuple[int, ...]]]) -> tuple[bytes, int]:
    """The length prefix and header of a safetensors file, and how many data bytes follow."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in tensors:
        count = 1
        for dim in shape:
            count *= dim
        size = count * _DTYPE_SIZE[dtype]
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offset


def config_json(architecture: str = "LlamaForCausalLM") -> bytes:
    config = {
        "architectures": [architecture],
        "model_type": "llama",
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "vocab_size": len(WORDS),
        "torch_dtype": "float32",
    }
    return json.dumps(config, indent=2).encode()


def tokenizer_json() -> bytes:
    vocab = {word: index for index, word in enumerate(WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer.to_str().encode()


# --- GGUF v3 -------------------------------------------------------------------------------------
_U32, _STRING, _U64 = 4, 8, 10
GGML_F32, GGML_Q8_0 = 0, 8
FILE_TYPE_Q8_0 = 7


def _gguf_string(value: str) -> bytes:
    raw = value.encode()
    return struct.pack("<Q", len(raw)) + raw


def _gguf_kv(key: str, kind: int, value: object) -> bytes:
    body = _gguf_string(key) + struct.pack("<I", kind)
    if kind == _STRING:
        assert isinstance(value, str)
        return body + _gguf_string(value)
    assert isinstance(value, int)
    return body + struct.pack("<I" if kind == _U32 else "<Q", value)


def _tensor_size(kind: int, dims: tuple[int, ...]) -> int:
    count = 1
    for dim in dims:
        count *= dim
    return count * 4 if kind == GGML_F32 else count // 32 * 34


def gguf_bytes(*, architecture: str = "llama", seed: int = 2, alignment: int = 32) -> bytes:
    """A GGUF v3 file: llama architecture, Q8_0 weights and an F32 embedding."""
    tensors = [
        ("token_embd.weight", GGML_F32, (16, len(WORDS))),
        ("blk.0.attn_q.weight", GGML_Q8_0, (32, 16)),
        ("output.weight", GGML_Q8_0, (32, 16)),
    ]
    kvs = [
        _gguf_kv("general.architecture", _STRING, architecture),
        _gguf_kv("general.name", _STRING, "fleet tiny gguf"),
        _gguf_kv("general.file_type", _U32, FILE_TYPE_Q8_0),
        _gguf_kv("general.alignment", _U32, alignment),
        _gguf_kv(f"{architecture}.context_length", _U32, 128),
    ]
    infos, offset = b"", 0
    for name, kind, dims in tensors:
        infos += _gguf_string(name) + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", kind, offset)
        size = _tensor_size(kind, dims)
        offset += size + (-size % alignment)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + infos
    head += b"\0" * (-len(head) % alignment)
    return head + _pattern(offset, seed)


def tiled(size: int, *, seed: int = 3, block: int = 1 << 20) -> Iterator[bytes]:
    """``size`` bytes of one repeated 1 MiB pattern, in pieces of at most ``block``: large files
    without the memory (the bytes do not depend on ``block``)."""
    pattern = _pattern(_TILE, seed)
    sent = 0
    while sent < size:
        at = sent % _TILE
        piece = pattern[at : at + min(block, size - sent, _TILE - at)]
        sent += len(piece)
        yield piece


_TILE = 1 << 20
