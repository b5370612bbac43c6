"""deploy/image/lockpick.py: an image installs exactly the lock's entries pip chose for it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCK = (ROOT / "requirements.lock").read_text()


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lockpick", ROOT / "deploy/image/lockpick.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lockpick = load()


def test_every_entry_keeps_its_hashes_and_marker_but_not_its_comments() -> None:
    entries = lockpick.entries(LOCK)
    tops = [line for line in LOCK.splitlines() if line[:1].isalnum()]
    assert len(entries) == len(tops) > 100
    version, text = entries["async-timeout"]
    assert text.startswith(f"async-timeout=={version} ; python_full_version < '3.11.3'")
    assert "--hash=sha256:" in text
    assert "# via" not in text


def test_pins_are_versions_only() -> None:
    pins = lockpick.pins(LOCK).splitlines()
    assert "msgspec==" + lockpick.entries(LOCK)["msgspec"][0] in pins
    assert not [p for p in pins if "--hash" in p or ";" in p]


def test_the_report_picks_what_pip_chose_without_our_packages(tmp_path: Path) -> None:
    msgspec = lockpick.entries(LOCK)["msgspec"][0]
    report = tmp_path / "report.json"
    items = [
        {"metadata": {"name": "msgspec", "version": msgspec}},
        {"metadata": {"name": "fleet-core", "version": "0.1.0"}},
    ]
    report.write_text(json.dumps({"install": items}))
    picked = lockpick.pick(LOCK, lockpick.reported(report))
    assert picked.startswith(f"msgspec=={msgspec} \\\n    --hash=sha256:")
    assert "fleet" not in picked


def test_a_package_the_lock_does_not_pin_or_pins_otherwise_fails_the_build() -> None:
    with pytest.raises(SystemExit, match=r"not-in-the-lock is not in requirements\.lock"):
        lockpick.pick(LOCK, {"not-in-the-lock": "1.0"})
    with pytest.raises(SystemExit, match=r"pip chose msgspec 0\.0\.1"):
        lockpick.pick(LOCK, {"msgspec": "0.0.1"})
