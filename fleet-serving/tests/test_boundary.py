"""fleet-serving depends on the contract, never on fleet-core (by metadata and by import)."""

from __future__ import annotations

from fleet_testing.boundaries import dependency_closure, modules_loaded_by_importing


def test_dependency_closure_reaches_the_contract_not_core() -> None:
    closure = dependency_closure("fleet-serving")
    assert "fleet-contract" in closure
    assert "kopf" in closure
    assert "fleet-core" not in closure, " -> ".join(closure["fleet-core"])


def test_importing_every_module_loads_no_core() -> None:
    imported, loaded = modules_loaded_by_importing("fleet_serving")
    assert all(name in loaded for name in imported)
    assert not any(name == "fleet_core" or name.startswith("fleet_core.") for name in loaded)
