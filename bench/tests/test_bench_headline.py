"""The table docs/benchmarks.md opens with: one row per judged target, built from the sections'
own tables, kept true when a section is rerun, and true of the committed report."""

from __future__ import annotations

from pathlib import Path

from bench import gateway_bench, headline, report
from bench.headline import Row

GATEWAY = [
    "## Gateway overhead",
    "",
    "| target | measured | verdict |",
    "|---|---|---|",
    "| gateway/floor throughput, plain c=32 >= 70% | 86% (rounds 66%-99%) | met |",
    "| added p50 to the first stream frame (a few ms) | 0.36 ms | met |",
    "| added p50 at c=64 (for reference) | -4.48 ms | |",
    "| budget admission p50 with the full ledger within 20% of empty | 31% | NOT met |",
]
SOAK = [
    "## Soak",
    "",
    "| measure | before | after | target | verdict |",
    "|---|---|---|---|---|",
    "| RSS | 71.6 MB | 71.7 MB (+0.1%) | <= +10% | met |",
]
COSTS = [
    "## Closing a month",
    "",
    "| measure | figure | target |",
    "|---|---|---|",
    "| close, wall time | 26.8 s | < 60 s (meets) |",
    "| peak RSS, Python process | 148 MiB | < 1 GiB |",
    "| Postgres temporary files | 726 MiB | — |",
]
CONSOLE = [
    "## Console",
    "",
    "| call | p50 | p95 | target p95 ≤ 200 ms |",
    "|---|---|---|---|",
    "| whoami | 2 ms | 3 ms | meets |",
    "| usage by day | 50 ms | 67 ms | meets |",
    "| from raw rows (SQL only; for reference) | 312 ms | 446 ms | — |",
]


def _sections(*sections: list[str]) -> dict[str, list[str]]:
    return {section[0]: section for section in sections}


def test_every_table_shape_gives_one_row_per_judged_target() -> None:
    found = list(headline.rows(_sections(GATEWAY, SOAK, COSTS, CONSOLE)))
    assert found == [
        Row("Gateway overhead", "gateway/floor throughput, plain c=32", ">= 70%", "86%", True),
        Row("Gateway overhead", "added p50 to the first stream frame", "a few ms", "0.36 ms", True),
        Row(
            "Gateway overhead",
            "budget admission p50 with the full ledger",
            "within 20% of empty",
            "31%",
            False,
        ),
        Row("Soak", "RSS", "<= +10%", "71.7 MB (+0.1%)", True),
        Row("Closing a month", "close, wall time", "< 60 s", "26.8 s", True),
        Row("Console", "each of 2 calls, p95", "≤ 200 ms", "slowest 67 ms (usage by day)", True),
    ]


def test_the_table_counts_what_is_met_and_marks_what_is_not() -> None:
    lines = headline.table(_sections(GATEWAY))
    assert "2 of 3 met." in lines[2]
    assert lines[-1].endswith("| 31% | **NO** |")


def test_a_rerun_section_updates_its_rows_and_the_others_keep_theirs(tmp_path: Path) -> None:
    written = tmp_path / "benchmarks.md"
    report.write([GATEWAY, SOAK], path=written, seconds=1)
    rerun = [line.replace("| 71.7 MB (+0.1%) | <= +10% | met |", "| 90 MB (+26%) | <= +10% |"
                          " NOT met |") for line in SOAK]  # fmt: skip
    report.write([rerun], path=written, seconds=1)
    text = written.read_text()
    assert text.count("## Targets") == 1
    assert text.index("## Targets") < text.index("## Method") < text.index("## Gateway overhead")
    targets = text.split("## Targets")[1].split("## Method")[0]
    assert "| Soak: RSS | <= +10% | 90 MB (+26%) | **NO** |" in targets
    assert "| Gateway overhead: gateway/floor throughput, plain c=32 | >= 70% | 86% | yes |" in (
        targets
    )
    assert "2 of 4 met." in targets


def test_the_committed_report_opens_with_the_table_of_its_own_sections() -> None:
    text = (gateway_bench.ROOT / "docs" / "benchmarks.md").read_text()
    sections = report.sections_of(text)
    measured = {h: lines for h, lines in sections.items() if h not in report.GENERATED}
    written = [line for line in sections[report.TARGETS] if line]
    assert written == [line for line in headline.table(measured) if line]
