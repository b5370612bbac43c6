"""The contract depends on msgspec alone, so both services can share it without each other."""

from __future__ import annotations

from fleet_testing.boundaries import dependency_closure, modules_loaded_by_importing


def test_contract_closure_is_msgspec_only() -> None:
    assert set(dependency_closure("fleet-contract")) == {"fleet-contract", "msgspec"}


def test_importing_the_contract_loads_none_of_our_other_code() -> None:
    _, loaded = modules_loaded_by_importing("fleet_contract")
    ours = {name.split(".")[0] for name in loaded if name.startswith("fleet_")}
    assert ours == {"fleet_contract"}
