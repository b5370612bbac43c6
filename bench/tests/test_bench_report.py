"""``make bench``'s report: a section rerun replaces the one of its heading, every other stays as
the last run left it, and the file ends with one newline whichever section comes last."""

from __future__ import annotations

from pathlib import Path

from bench import report


def test_a_rerun_section_replaces_its_own_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    written = tmp_path / "benchmarks.md"
    report.write([["## First", "", "one"], ["## Last", "", "two"]], path=written, seconds=1)
    report.write([["## First", "", "one again"]], path=written, seconds=1)  # "## Last" is now kept
    text = written.read_text()
    assert text.endswith("two\n")
    assert not text.endswith("\n\n")
    assert "one again" in text
    assert "\none\n" not in text
    assert text.index("## First") < text.index("## Last")
    report.write([["## Last", "", "three"]], path=written, seconds=1)
    again = written.read_text()
    assert again.endswith("three\n")
    assert "one again" in again
    assert "two" not in again
