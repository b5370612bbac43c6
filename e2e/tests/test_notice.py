"""NOTICE lists every package the locks pin, and goes stale the moment a lock changes.

The first test is the guard the release depends on: it regenerates NOTICE from requirements.lock
and this venv's metadata (the venv is built from that lock) and fails with the command to run when
the committed file differs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import notice

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of the files the NOTICE is made from, with a NOTICE freshly generated for it."""
    shutil.copy(ROOT / notice.PYTHON_LOCK, tmp_path / notice.PYTHON_LOCK)
    assert notice.main(["--root", str(tmp_path)]) == 0
    return tmp_path


def test_committed_notice_matches_the_locks() -> None:
    expected = notice.render(ROOT, notice.installed_licenses())
    assert (ROOT / "NOTICE").read_text() == expected, "NOTICE is stale: run `make notice`"


def test_every_pinned_package_is_listed_with_a_license() -> None:
    text = (ROOT / "NOTICE").read_text()
    pins = notice.python_pins((ROOT / notice.PYTHON_LOCK).read_text())
    assert len(pins) > 100
    for name, version in pins:
        line = next(x for x in text.splitlines() if x.startswith(f"{notice.normalize(name)} "))
        assert line.split()[1] == version
        assert len(line.split()) > 2, f"{name} has no license"


def test_any_change_to_the_lock_makes_the_notice_stale(repo: Path) -> None:
    assert notice.main(["--root", str(repo), "--check"]) == 0
    lock = repo / notice.PYTHON_LOCK
    lock.write_text(lock.read_text().replace("\n", "\n# re-resolved\n", 1))
    assert notice.main(["--root", str(repo), "--check"]) == 1


def test_a_package_dropped_from_the_lock_leaves_the_notice(repo: Path) -> None:
    lock = repo / notice.PYTHON_LOCK
    lines = lock.read_text().splitlines(keepends=True)
    start = next(i for i, x in enumerate(lines) if x.startswith("pyyaml=="))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    lock.write_text("".join(lines[:start] + lines[end:]))
    assert notice.main(["--root", str(repo)]) == 0
    assert "\npyyaml " not in (repo / "NOTICE").read_text()


def test_a_pin_with_no_known_license_refuses(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = repo / notice.PYTHON_LOCK
    lock.write_text(lock.read_text() + "not-installed-anywhere==1.0 \\\n    --hash=sha256:00\n")
    assert notice.main(["--root", str(repo)]) == 2
    assert "not-installed-anywhere==1.0" in capsys.readouterr().err


def test_an_npm_lock_gets_its_own_section_and_digest(repo: Path) -> None:
    (repo / "web").mkdir()
    lock = {
        "lockfileVersion": 3,
        "packages": {
            "": {"name": "fleet-web", "version": "0.1.0"},
            "node_modules/react": {"version": "19.1.0", "license": "MIT"},
            "node_modules/@scope/x/node_modules/y": {"version": "1.0.0", "license": "ISC"},
        },
    }
    (repo / "web/package-lock.json").write_text(json.dumps(lock))
    assert notice.main(["--root", str(repo), "--check"]) == 1
    assert notice.main(["--root", str(repo)]) == 0
    text = (repo / "NOTICE").read_text()
    assert "JavaScript packages (web/package-lock.json)" in text
    assert "react 19.1.0" in text
    assert "y 1.0.0" in text
    assert "fleet-web" not in text
    assert "web/package-lock.json sha256:" in text


def test_an_npm_package_without_a_license_refuses() -> None:
    lock = {"packages": {"node_modules/q": {"version": "1.0.0"}}}
    with pytest.raises(notice.NoticeError, match=r"q@1\.0\.0"):
        notice.npm_packages(json.dumps(lock))
