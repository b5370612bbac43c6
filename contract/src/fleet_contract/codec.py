"""Encoding and decoding of inventory reports, with errors a receiver can show a client.

Decoders are built once (msgspec's advice). The schema version is read before the full decode so
that a report of an unknown major is refused as such, not as a confusing type error in a field
that major happens to define differently.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fleet_contract.errors import DecodeError, UnsupportedSchemaVersion
from fleet_contract.inventory import SUPPORTED_SCHEMA_VERSIONS, InventoryReport

__all__ = ["decode_report", "encode_report", "report_schema"]


class _VersionProbe(msgspec.Struct, rename="camel"):
    schema_version: Any = None


_probe = msgspec.json.Decoder(_VersionProbe)
_decoder = msgspec.json.Decoder(InventoryReport)
_encoder = msgspec.json.Encoder()


def decode_report(data: bytes | str) -> InventoryReport:
    """Decode and validate a report; unknown fields are ignored, wrong types name their path."""
    try:
        version = _probe.decode(data).schema_version
    except msgspec.DecodeError as exc:
        raise DecodeError(str(exc)) from exc
    if version is not None and version not in SUPPORTED_SCHEMA_VERSIONS:
        raise UnsupportedSchemaVersion(version, SUPPORTED_SCHEMA_VERSIONS)
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise DecodeError(str(exc)) from exc


def encode_report(report: InventoryReport) -> bytes:
    """Encode a report as camelCase JSON."""
    return _encoder.encode(report)


def report_schema() -> dict[str, Any]:
    """The JSON Schema of the current report types, as snapshotted in ``contract/schemas/``."""
    return msgspec.json.schema(InventoryReport)
