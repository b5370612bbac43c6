"""The gateway's process loads only the gateway: the console script's module, imported
in a fresh interpreter, pulls in none of the control plane, registry, cost pool, hub or stub."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fleet_core.shared.asgi_server import YOUNG_GC_THRESHOLD

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
    assert scripts["fleet-apiserver"] == "fleet_core.control_plane.main:apiserver_main"
    assert scripts["fleet-stub-engine"] == "fleet_core.devtools.stub_engine.main:main"


SERVE_ONCE = """
import asyncio, gc, json, os, signal, sys
from pathlib import Path
from fleet_core.gateway.config import load_config
from fleet_core.gateway.main import _run_gateway
from fleet_core.gateway.settings import from_env

async def serve_and_stop():
    settings = from_env({}, load_config(Path(sys.argv[1])))
    asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGTERM)
    await _run_gateway(settings, listen="127.0.0.1:0", server="uvicorn")

before = [gc.get_freeze_count(), gc.get_threshold()[0]]
asyncio.run(serve_and_stop())
print(json.dumps({"before": before, "after": [gc.get_freeze_count(), gc.get_threshold()[0]]}))
"""


def test_the_gateway_freezes_its_start_up_heap_before_serving(tmp_path: Path) -> None:
    """What start-up built is out of every later collection and young collections run less often
    (`serving.settle_heap`): the garbage collector was a seventh of a request's CPU."""
    config = tmp_path / "fleet.yaml"
    config.write_text("upstreams:\n  - id: a\n    model: m\n    base_url: http://127.0.0.1:9\n")
    out = subprocess.run(
        [sys.executable, "-c", SERVE_ONCE, str(config)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    seen = json.loads(out.splitlines()[-1])
    assert seen["before"] == [0, 700]  # CPython's defaults: the probe starts from them
    frozen, young = seen["after"]
    assert frozen > 10_000  # the modules, settings and app: far more than a handful of objects
    assert young == YOUNG_GC_THRESHOLD
