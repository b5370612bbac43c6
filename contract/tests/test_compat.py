"""The compatibility check catches every breaking kind and lets additive changes through.

The end-to-end cases edit a temporary copy of the contract package's source and run
``python -m fleet_contract.compat`` against it in a fresh interpreter, exactly as CI does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_contract import compat, report_schema, weights_schema

CONTRACT = Path(__file__).parents[1]
INVENTORY = Path("src/fleet_contract/inventory.py")
WEIGHTS = Path("src/fleet_contract/weights.py")
VERSION = Path("src/fleet_contract/_version.py")


def run_on_copy(
    tmp_path: Path, edits: dict[Path, tuple[str, str]]
) -> subprocess.CompletedProcess[str]:
    copy = tmp_path / "contract"
    shutil.copytree(CONTRACT, copy, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    for rel, (old, new) in edits.items():
        source = (copy / rel).read_text()
        assert old in source, f"the test's edit no longer applies to {rel}: {old!r}"
        (copy / rel).write_text(source.replace(old, new, 1))
    return subprocess.run(
        [sys.executable, "-m", "fleet_contract.compat"],
        env={"PYTHONPATH": str(copy / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )


def test_unchanged_contract_passes(tmp_path: Path) -> None:
    result = run_on_copy(tmp_path, {})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "inventory: ok: compatible with 1.4.0" in result.stdout
    assert "weights: ok: compatible with 1.4.0" in result.stdout


BREAKING = {
    "removed": ("    schedulable: bool\n", "", "$.nodes[].schedulable"),
    "renamed": (
        "    memory_mib: NonNegative\n",
        "    memory_mb: NonNegative\n",
        "$.nodes[].gpus[].memoryMib",
    ),
    "type-changed": (
        "    ready_replicas: NonNegative\n",
        "    ready_replicas: str\n",
        "$.deployments[].readyReplicas",
    ),
    "made-required": ('    reason: str = ""\n', "    reason: str\n", "$.deployments[].reason"),
    "enum-value-removed": (
        'Phase = Literal["Pending", "Scheduling", "Ready", "Failed"]',
        'Phase = Literal["Pending", "Scheduling", "Ready"]',
        "$.deployments[].phase",
    ),
    "new-required-field": (
        '    reason: str = ""\n',
        '    reason: str = ""\n    region: str\n',
        "$.deployments[].region",
    ),
    "items-type-changed": (
        "    gpus: tuple[Gpu, ...] = ()\n",
        "    gpus: tuple[str, ...] = ()\n",
        "$.nodes[].gpus[]",
    ),
    "unknown-fields-forbidden": (
        'class Endpoint(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):',
        'class Endpoint(msgspec.Struct, kw_only=True, frozen=True, rename="camel",\n'
        "               forbid_unknown_fields=True):",
        "$.deployments[].endpoints[]{}",
    ),
}


@pytest.mark.parametrize("kind", sorted(BREAKING))
def test_breaking_change_fails_without_major_bump(tmp_path: Path, kind: str) -> None:
    old, new, path = BREAKING[kind]
    result = run_on_copy(tmp_path, {INVENTORY: (old, new)})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout
    flagged = [line for line in result.stdout.splitlines() if line.strip().startswith("BREAKING")]
    assert any(path in line for line in flagged), result.stdout


@pytest.mark.parametrize("kind", sorted(BREAKING))
def test_breaking_change_passes_with_major_bump(tmp_path: Path, kind: str) -> None:
    old, new, _ = BREAKING[kind]
    bump = ('__version__ = "1.4.0"', '__version__ = "2.0.0"')
    result = run_on_copy(tmp_path, {INVENTORY: (old, new), VERSION: bump})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "major bump" in result.stdout


def test_added_optional_field_passes(tmp_path: Path) -> None:
    edit = ('    reason: str = ""\n', '    reason: str = ""\n    region: str | None = None\n')
    result = run_on_copy(tmp_path, {INVENTORY: edit})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "additive added at $.deployments[].region" in result.stdout


def test_minor_bump_with_breaking_change_still_fails(tmp_path: Path) -> None:
    old, new, _ = BREAKING["removed"]
    bump = ('__version__ = "1.4.0"', '__version__ = "1.4.1"')
    result = run_on_copy(tmp_path, {INVENTORY: (old, new), VERSION: bump})
    assert result.returncode == 1


def test_version_older_than_the_last_snapshot_fails(tmp_path: Path) -> None:
    bump = ('__version__ = "1.4.0"', '__version__ = "1.2.5"')
    result = run_on_copy(tmp_path, {VERSION: bump})
    assert result.returncode == 1
    assert "older than 1.4.0" in result.stdout


def test_the_committed_snapshots_match_the_released_types() -> None:
    schemas = CONTRACT / "schemas"
    since_1_0 = compat.compare(json.loads((schemas / "inventory-v1.0.0.json").read_text()),
                               report_schema())  # fmt: skip
    assert sorted((c.path, c.breaking) for c in since_1_0) == [
        ("$.deployments[].accelerator", False),
        ("$.deployments[].adapters", False),
        ("$.deployments[].gpuShare", False),
        ("$.deployments[].registryModel", False),
        ("$.nodes[].gpus[].migSlices[].share", False),
        ("$.nodes[].gpus[].resource", False),
        ("$.reportIntervalSeconds", False),
    ]
    since_1_1 = compat.compare(json.loads((schemas / "inventory-v1.1.0.json").read_text()),
                               report_schema())  # fmt: skip
    assert sorted((c.path, c.breaking) for c in since_1_1) == [
        ("$.deployments[].accelerator", False),
        ("$.deployments[].adapters", False),
        ("$.deployments[].gpuShare", False),
        ("$.nodes[].gpus[].migSlices[].share", False),
        ("$.nodes[].gpus[].resource", False),
        ("$.reportIntervalSeconds", False),
    ]
    since_1_2 = compat.compare(json.loads((schemas / "inventory-v1.2.0.json").read_text()),
                               report_schema())  # fmt: skip
    assert sorted((c.path, c.breaking) for c in since_1_2) == [
        ("$.deployments[].accelerator", False),
        ("$.deployments[].adapters", False),
        ("$.deployments[].gpuShare", False),
        ("$.nodes[].gpus[].migSlices[].share", False),
        ("$.reportIntervalSeconds", False),
    ]
    assert compat.compare(json.loads((schemas / "inventory-v1.4.0.json").read_text()),
                          report_schema()) == []  # fmt: skip
    assert compat.compare(json.loads((schemas / "weights-v1.4.0.json").read_text()),
                          weights_schema()) == []  # fmt: skip


def test_a_breaking_change_to_the_weights_document_fails(tmp_path: Path) -> None:
    edit = ("    sha256: Sha256\n", "    digest: Sha256\n")
    result = run_on_copy(tmp_path, {WEIGHTS: edit})
    assert result.returncode == 1, result.stdout
    assert "BREAKING removed at $.files[].sha256" in result.stdout
    assert "inventory: ok" in result.stdout


def test_compare_reports_enum_additions_and_loosened_bounds() -> None:
    old = {
        "type": "object",
        "properties": {"e": {"enum": ["a", "b"]}, "n": {"type": "integer", "minimum": 1}},
        "required": ["e"],
    }
    new = {
        "type": "object",
        "properties": {"e": {"enum": ["a", "b", "c"]}, "n": {"type": "integer", "minimum": 0}},
        "required": ["e"],
    }
    changes = {(c.path, c.kind, c.breaking) for c in compat.compare(old, new)}
    assert changes == {("$.e", "enum-added", True), ("$.n", "loosened", False)}


def test_compare_flags_a_tightened_bound() -> None:
    old = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 10}}}
    new = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 5}}}
    [change] = compat.compare(old, new)
    assert (change.kind, change.breaking) == ("narrowed", True)


def test_write_snapshot_refuses_to_rewrite_a_released_version(tmp_path: Path) -> None:
    schema = report_schema()
    compat.write_snapshot(schema, (1, 0, 0), tmp_path)
    compat.write_snapshot(schema, (1, 0, 0), tmp_path)  # identical: fine
    changed = {**schema, "title": "changed"}
    with pytest.raises(SystemExit, match="released and differs"):
        compat.write_snapshot(changed, (1, 0, 0), tmp_path)
