"""Encoding and decoding of inventory reports, with errors a receiver can show a client.

Decoders are built once (msgspec's advice). The schema version is read before the full decode so
that a report of an unknown major is refused as such, not as a confusing type error in a field
that major happens to define differently.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from fleet_contract.errors import DecodeError, UnsupportedSchemaVersion
from fleet_contract.inventory import SUPPORTED_SCHEMA_VERSIONS, InventoryReport

__all__ = ["decode_report", "encode_report", "report_schema"]

T = TypeVar("T")


class _VersionProbe(msgspec.Struct, rename="camel"):
    schema_version: Any = None


_probe = msgspec.json.Decoder(_VersionProbe)
_decoder = msgspec.json.Decoder(InventoryReport)
_encoder = msgspec.json.Encoder()


def decoded(decoder: msgspec.json.Decoder[T], data: bytes | str) -> T:
    """``decoder.decode(data)``, msgspec's error (naming the field path) raised as ours."""
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise DecodeError(str(exc)) from exc


def decode_report(data: bytes | str) -> InventoryReport:
    """Decode and validate a report; unknown fields are ignored, wrong types name their path."""
    version = decoded(_probe, data).schema_version
    if version is not None and version not in SUPPORTED_SCHEMA_VERSIONS:
        raise UnsupportedSchemaVersion(version, SUPPORTED_SCHEMA_VERSIONS)
    return decoded(_decoder, data)


def encode_report(report: InventoryReport) -> bytes:
    """Encode a report as camelCase JSON."""
    return _encoder.encode(report)


def report_schema() -> dict[str, Any]:
    """The JSON Schema of the current report types, as snapshotted in ``contract/schemas/``."""
    return msgspec.json.schema(InventoryReport)
