"""The console's build stays within its promises: no registry address in the committed npm lock,
and an initial bundle (what the shell loads before any page chunk) under 400 KB gzipped."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from fleet_core.gateway.console.settings import BUILT_DIR

WEB = Path(__file__).resolve().parents[2] / "web"
INITIAL_BUDGET = 400 * 1024


def test_the_npm_lock_records_no_registry_address() -> None:
    lock = json.loads((WEB / "package-lock.json").read_text())
    assert lock["packages"], "the lock lists the packages"
    for name, entry in lock["packages"].items():
        assert "resolved" not in entry, f"{name} records where it was downloaded from"
        assert "integrity" in entry or name == "" or entry.get("link"), f"{name} has no hash"
    text = (WEB / "package-lock.json").read_text()
    assert not re.search(r"registry\.|/-/[^\"]+\.tgz", text), "a registry address or tarball URL"
    assert "omit-lockfile-registry-resolved=true" in (WEB / ".npmrc").read_text().splitlines()


def _initial_assets(index: str) -> list[str]:
    """The scripts, module preloads and styles index.html itself loads."""
    return re.findall(r'(?:src|href)="/assets/([^"]+)"', index)


def test_the_initial_bundle_is_under_400_kb_gzipped() -> None:
    index = BUILT_DIR / "index.html"
    if not index.is_file():
        pytest.fail("the console is not built: run `make web` (make test builds it first)")
    names = _initial_assets(index.read_text())
    assert any(name.endswith(".js") for name in names), names
    sizes = {
        name: len(gzip.compress((BUILT_DIR / "assets" / name).read_bytes(), 9)) for name in names
    }
    total = sum(sizes.values())
    assert total < INITIAL_BUDGET, f"initial bundle {total} bytes gzipped: {sizes}"
    charts = [p.name for p in (BUILT_DIR / "assets").glob("UsageCharts-*.js")]
    assert charts, "the charts are a chunk of their own"
    assert not any(name.startswith("UsageCharts") for name in names), "and not loaded up front"
