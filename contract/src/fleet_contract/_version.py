"""The contract package version: its own, independent of fleet-core and fleet-serving (ADR 0001)."""

__version__ = "1.4.0"
