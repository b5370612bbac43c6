"""P7: nothing reachable from fleet-core is Kubernetes, by metadata and by import."""

from __future__ import annotations

from fleet_testing.boundaries import dependency_closure, modules_loaded_by_importing

FORBIDDEN_DISTS = {"kubernetes", "kubernetes-asyncio", "kopf", "fleet-serving"}
FORBIDDEN_MODULES = {"kubernetes", "kubernetes_asyncio", "kopf", "fleet_serving"}


def test_dependency_closure_has_no_kubernetes() -> None:
    closure = dependency_closure("fleet-core")
    assert "fleet-contract" in closure  # the walk really follows requirements
    assert "aiohttp" in closure
    reached = {name: " -> ".join(closure[name]) for name in FORBIDDEN_DISTS & closure.keys()}
    assert reached == {}


def test_importing_every_module_loads_no_kubernetes() -> None:
    imported, loaded = modules_loaded_by_importing("fleet_core")
    assert "fleet_core" in loaded
    assert all(name in loaded for name in imported)
    top_level = {name.split(".")[0] for name in loaded}
    assert top_level & FORBIDDEN_MODULES == set()
