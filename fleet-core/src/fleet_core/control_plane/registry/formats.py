"""Weight formats verified by parsing what was stored, never by file name.

safetensors: an 8-byte little-endian header length, a JSON header of tensors (dtype, shape,
``data_offsets`` relative to the data section) and the data. A file is valid when the header parses,
every dtype is known, and every tensor's byte range is exactly its shape × dtype size and lies
inside the file. GGUF: ``GGUF`` magic, version 2 or 3, typed metadata (architecture, file type,
alignment), tensor infos and aligned tensor data, every tensor inside the file.

Parsers read through ``Blob.read(offset, length)``, so a header is fetched from the object store in
ranges and a multi-GiB file is never held in memory.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = [
    "Blob",
    "FormatError",
    "GgufFacts",
    "SafetensorsFacts",
    "parse_gguf",
    "parse_safetensors",
    "sniff",
]

Read = Callable[[int, int], Awaitable[bytes]]

SAFETENSORS_DTYPES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
"""The safetensors library's own limit on the header size."""

# ggml tensor types: (block size in elements, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 30: ("BF16", 1, 2),
}  # fmt: skip
GGUF_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
}  # fmt: skip
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
MAX_GGUF_COUNT = 1 << 24
"""More tensors, metadata entries or array elements than this is a corrupt header, not a model."""


class FormatError(Exception):
    """The file is not what it claims to be; ``str()`` is the reason shown on the model."""


@dataclass(frozen=True)
class Blob:
    name: str
    size: int
    read: Read


@dataclass(frozen=True)
class SafetensorsFacts:
    parameters: int
    dtype: str
    """The dtype holding the most parameters."""


@dataclass(frozen=True)
class GgufFacts:
    architecture: str
    quantization: str
    parameters: int
    version: int


async def sniff(blob: Blob) -> str | None:
    """``"gguf"``, ``"safetensors"`` or None, from the first bytes (the content, not the name)."""
    head = await blob.read(0, min(blob.size, 9))
    if head[:4] == b"GGUF":
        return "gguf"
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"
    return None


async def parse_safetensors(blob: Blob) -> SafetensorsFacts:
    if blob.size < 8:
        raise FormatError(f"{blob.name}: {blob.size} bytes is too short for a safetensors file")
    (length,) = struct.unpack("<Q", await blob.read(0, 8))
    if length > MAX_SAFETENSORS_HEADER or 8 + length > blob.size:
        raise FormatError(f"{blob.name}: header length {length} does not fit the file")
    try:
        header = json.loads(await blob.read(8, length))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{blob.name}: the safetensors header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise FormatError(f"{blob.name}: the safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    return _tensors(blob.name, header, data_size=blob.size - 8 - length)


def _tensors(name: str, header: dict[str, object], *, data_size: int) -> SafetensorsFacts:
    by_dtype: Counter[str] = Counter()
    for tensor_name, info in header.items():
        dtype, count, begin, end = _tensor(name, tensor_name, info)
        if end - begin != count * SAFETENSORS_DTYPES[dtype]:
            raise FormatError(
                f"{name}: tensor {tensor_name} spans {end - begin} bytes, but its shape and dtype "
                f"need {count * SAFETENSORS_DTYPES[dtype]}"
            )
        if end > data_size:
            raise FormatError(
                f"{name}: tensor {tensor_name} ends at byte {end} of a {data_size}-byte data "
                "section (truncated file?)"
            )
        by_dtype[dtype] += count
    if not by_dtype:
        raise FormatError(f"{name}: the safetensors header lists no tensors")
    return SafetensorsFacts(parameters=sum(by_dtype.values()), dtype=by_dtype.most_common(1)[0][0])


def _tensor(name: str, tensor: str, info: object) -> tuple[str, int, int, int]:
    if not isinstance(info, dict):
        raise FormatError(f"{name}: tensor {tensor} is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
        raise FormatError(f"{name}: tensor {tensor} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise FormatError(f"{name}: tensor {tensor} has an invalid shape {shape!r}")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and o >= 0 for o in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise FormatError(f"{name}: tensor {tensor} has invalid data_offsets {offsets!r}")
    count = 1
    for dim in shape:
        count *= dim
    return dtype, count, int(offsets[0]), int(offsets[1])


class _Cursor:
    """Sequential reads over a ``Blob`` through a 1 MiB window: GGUF headers can be megabytes."""

    WINDOW = 1 << 20

    def __init__(self, blob: Blob) -> None:
        self.blob, self.position = blob, 0
        self._start, self._buffer = 0, b""

    async def take(self, length: int) -> bytes:
        if self.position + length > self.blob.size:
            raise FormatError(
                f"{self.blob.name}: the GGUF header runs past the end of the file at byte "
                f"{self.blob.size} (truncated file?)"
            )
        end = self.position + length
        if not (self._start <= self.position and end <= self._start + len(self._buffer)):
            self._start = self.position
            size = min(max(length, self.WINDOW), self.blob.size - self.position)
            self._buffer = await self.blob.read(self.position, size)
        at = self.position - self._start
        self.position = end
        return self._buffer[at : at + length]

    async def unpack(self, fmt: str) -> int | float | bool:
        value: int | float | bool = struct.unpack(fmt, await self.take(struct.calcsize(fmt)))[0]
        return value

    async def count(self, what: str) -> int:
        value = int(await self.unpack("<Q"))
        if value > MAX_GGUF_COUNT:
            raise FormatError(f"{self.blob.name}: {value} {what} is not a plausible GGUF header")
        return value

    async def string(self) -> str:
        length = await self.count("string bytes")
        try:
            return (await self.take(length)).decode()
        except UnicodeDecodeError as exc:
            raise FormatError(f"{self.blob.name}: a GGUF string is not UTF-8") from exc


async def parse_gguf(blob: Blob) -> GgufFacts:
    cursor = _Cursor(blob)
    if await cursor.take(4) != b"GGUF":
        raise FormatError(f"{blob.name}: no GGUF magic")
    version = int(await cursor.unpack("<I"))
    if version not in (2, 3):
        raise FormatError(f"{blob.name}: GGUF version {version} is not supported (2 or 3)")
    tensors = await cursor.count("tensors")
    metadata = {}
    for _ in range(await cursor.count("metadata entries")):
        key = await cursor.string()
        metadata[key] = await _value(cursor, int(await cursor.unpack("<I")))
    infos = [await _tensor_info(cursor) for _ in range(tensors)]
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0:
        raise FormatError(f"{blob.name}: general.alignment {alignment!r} is invalid")
    data_start = cursor.position + (-cursor.position % alignment)
    return _gguf_facts(blob, metadata, infos, data_start=data_start, version=version)


async def _value(cursor: _Cursor, kind: int) -> object:
    if kind in _SCALARS:
        return await cursor.unpack(_SCALARS[kind])
    if kind == _STRING:
        return await cursor.string()
    if kind == _ARRAY:
        item = int(await cursor.unpack("<I"))
        length = await cursor.count("array elements")
        if item in _SCALARS:  # skipped, not decoded: vocabularies are long
            await cursor.take(length * struct.calcsize(_SCALARS[item]))
            return None
        for _ in range(length):
            await _value(cursor, item)
        return None
    raise FormatError(f"{cursor.blob.name}: unknown GGUF metadata type {kind}")


async def _tensor_info(cursor: _Cursor) -> tuple[str, int, int, int]:
    name = await cursor.string()
    dims = int(await cursor.unpack("<I"))
    if dims > 8:
        raise FormatError(f"{cursor.blob.name}: tensor {name} has {dims} dimensions")
    count = 1
    for _ in range(dims):
        count *= int(await cursor.unpack("<Q"))
    kind, offset = int(await cursor.unpack("<I")), int(await cursor.unpack("<Q"))
    return name, kind, count, offset


def _gguf_facts(
    blob: Blob,
    metadata: dict[str, object],
    infos: list[tuple[str, int, int, int]],
    *,
    data_start: int,
    version: int,
) -> GgufFacts:
    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise FormatError(f"{blob.name}: GGUF metadata has no general.architecture")
    by_type: Counter[str] = Counter()
    for name, kind, count, offset in infos:
        end = data_start + offset + _ggml_size(blob.name, name, kind, count)
        if end > blob.size:
            raise FormatError(
                f"{blob.name}: tensor {name} ends at byte {end} of a {blob.size}-byte file "
                "(truncated file?)"
            )
        by_type[GGML_TYPES[kind][0] if kind in GGML_TYPES else f"ggml type {kind}"] += count
    if not infos:
        raise FormatError(f"{blob.name}: the GGUF file holds no tensors")
    file_type = metadata.get("general.file_type")
    quantization = GGUF_FILE_TYPES.get(file_type) if isinstance(file_type, int) else None
    return GgufFacts(
        architecture=architecture,
        quantization=quantization or by_type.most_common(1)[0][0],
        parameters=sum(by_type.values()),
        version=version,
    )


def _ggml_size(file: str, tensor: str, kind: int, count: int) -> int:
    if kind not in GGML_TYPES:
        return 0  # a newer quantization: its offset is still checked, its size cannot be
    _, block, size = GGML_TYPES[kind]
    if count % block:
        raise FormatError(f"{file}: tensor {tensor} has {count} elements, not whole blocks")
    return count // block * size
