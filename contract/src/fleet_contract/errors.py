"""Errors raised by the contract package.

ContractError
 ├── DecodeError             the bytes are not a valid report (names the field path)
 └── UnsupportedSchemaVersion  a valid-looking report of a major this package cannot read
"""

from __future__ import annotations

__all__ = ["ContractError", "DecodeError", "UnsupportedSchemaVersion"]


class ContractError(Exception):
    """Base class of every error this package raises."""


class DecodeError(ContractError):
    """The payload does not decode; the message names the offending field path (``$.nodes[0]…``)."""


class UnsupportedSchemaVersion(ContractError):
    """The report declares a schema major this package does not support."""

    def __init__(self, found: object, supported: tuple[int, ...]) -> None:
        self.found = found
        self.supported = supported
        wanted = ", ".join(str(v) for v in supported)
        super().__init__(f"unsupported schemaVersion {found!r}; this receiver supports: {wanted}")
