"""The inventory contract between fleet-serving (writer) and fleet-core (reader).

It imports no code of ours and nothing but msgspec, so both services can depend on it without
depending on each other. Its version is its own (``__version__``; ADR 0001).
"""

from fleet_contract._version import __version__
from fleet_contract.codec import decode_report, encode_report, report_schema
from fleet_contract.errors import ContractError, DecodeError, UnsupportedSchemaVersion
from fleet_contract.inventory import (
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    Endpoint,
    Engine,
    Gpu,
    InventoryReport,
    MigSlice,
    ModelDeployment,
    Node,
    NodeLabels,
    Phase,
    WeightFormat,
)

__all__ = [
    "SCHEMA_VERSION",
    "SUPPORTED_SCHEMA_VERSIONS",
    "ContractError",
    "DecodeError",
    "Endpoint",
    "Engine",
    "Gpu",
    "InventoryReport",
    "MigSlice",
    "ModelDeployment",
    "Node",
    "NodeLabels",
    "Phase",
    "UnsupportedSchemaVersion",
    "WeightFormat",
    "__version__",
    "decode_report",
    "encode_report",
    "report_schema",
]
