"""The contract between fleet-serving and fleet-core: the inventory report fleet-serving writes
and fleet-core reads, and a registry model's weights fleet-core serves and fleet-serving reads.

It imports no code of ours and nothing but msgspec, so both services can depend on it without
depending on each other. Its version is its own (``__version__``; ADR 0001).
"""

from fleet_contract._version import __version__
from fleet_contract.codec import decode_report, encode_report, report_schema
from fleet_contract.errors import ContractError, DecodeError, UnsupportedSchemaVersion
from fleet_contract.inventory import (
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    CardShare,
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
from fleet_contract.weights import (
    ModelWeights,
    WeightFile,
    decode_weights,
    encode_weights,
    weights_schema,
)

__all__ = [
    "SCHEMA_VERSION",
    "SUPPORTED_SCHEMA_VERSIONS",
    "CardShare",
    "ContractError",
    "DecodeError",
    "Endpoint",
    "Engine",
    "Gpu",
    "InventoryReport",
    "MigSlice",
    "ModelDeployment",
    "ModelWeights",
    "Node",
    "NodeLabels",
    "Phase",
    "UnsupportedSchemaVersion",
    "WeightFile",
    "WeightFormat",
    "__version__",
    "decode_report",
    "decode_weights",
    "encode_report",
    "encode_weights",
    "report_schema",
    "weights_schema",
]
