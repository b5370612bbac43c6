"""``make bench``'s report: a section rerun replaces the one of its heading, every other stays as
the last run left it, and the file ends with one newline whichever section comes last."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import gateway_bench


def test_a_rerun_section_replaces_its_own_and_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "docs").mkdir()
    monkeypatch.setattr(gateway_bench, "ROOT", tmp_path)
    report = tmp_path / "docs" / "benchmarks.md"
    gateway_bench.write_report([["## First", "", "one"], ["## Last", "", "two"]])
    gateway_bench.write_report([["## First", "", "one again"]])  # "## Last" is now kept
    text = report.read_text()
    assert text.endswith("two\n")
    assert not text.endswith("\n\n")
    assert "one again" in text
    assert "\none\n" not in text
    assert text.index("## First") < text.index("## Last")
    gateway_bench.write_report([["## Last", "", "three"]])
    again = report.read_text()
    assert again.endswith("three\n")
    assert "one again" in again
    assert "two" not in again
