"""The gateway's process loads only the gateway (issue 21): the console script's module, imported
in a fresh interpreter, pulls in none of the control plane, registry, cost pool, hub or stub."""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN = ("apiserver", "registry", "costs", "hub", "stub_engine")
PROBE = """
import json, sys
import fleet_core.gateway.main
print(json.dumps(sorted(m for m in sys.modules if m.startswith("fleet_core."))))
"""


def test_the_gateway_entry_point_imports_only_the_gateway() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout
    loaded = json.loads(out)
    assert "fleet_core.gateway.app" in loaded  # the probe measures something
    assert [m for m in loaded if m.split(".")[1] in FORBIDDEN] == []


def test_console_scripts_name_one_entry_module_each() -> None:
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts["fleet-gateway"] == "fleet_core.gateway.main:gateway_main"
    assert scripts["fleet-apiserver"] == "fleet_core.apiserver.main:apiserver_main"
    assert scripts["fleet-stub-engine"] == "fleet_core.stub_engine.main:main"
