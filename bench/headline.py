"""The table docs/benchmarks.md opens with: every judged target, what it measured, met or not.

Built from the report's sections as written, every time `report.write` writes the
file, so a section rerun alone updates its rows and the others keep the figures their last run
recorded. A section states a target in one of the report's table shapes:

- ``| target | measured | verdict |`` (gateway, admission, database mode, model pull): the
  target's threshold is the part of its name from the comparison on (``>= 70%``, ``<= 1 ms``,
  ``within 20% of empty``, or a trailing parenthesis); a row with an empty verdict is a figure
  for reference, not a target;
- ``| measure | before | after | target | verdict |`` (soak);
- ``| measure | figure | target |`` where the target cell ends ``(meets)`` or ``(misses)``
  (closing a month, operator);
- ``| call | p50 | p95 | target p95 ≤ 200 ms |`` with ``meets``/``misses`` per call (console),
  summed up as one row: every call, judged by the slowest; a call named ``for reference`` is not
  judged.

The measured cell is shortened to its first figure (the rounds and notes after it stay in the
section).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

__all__ = ["Row", "rows", "table"]

_COMPARISON = re.compile(r"\s(?=(?:>=|<=|≥|≤|<|>|within)\s)")
_TRAILING = re.compile(r"^(?P<what>.*?)\s*\((?P<target>[^()]*)\)$")
_JUDGED = re.compile(r"^(?P<target>.*?)\s*\((?P<verdict>meets|misses)\)$")


@dataclass(frozen=True)
class Row:
    section: str
    what: str
    target: str
    measured: str
    met: bool

    def line(self) -> str:
        verdict = "yes" if self.met else "**NO**"
        return f"| {self.section}: {self.what} | {self.target} | {self.measured} | {verdict} |"


def table(sections: Mapping[str, list[str]]) -> list[str]:
    """The markdown table of `rows`, with its heading and a line on where it comes from."""
    found = list(rows(sections))
    missed = sum(not row.met for row in found)
    return [
        "## Targets",
        "",
        f"Every judged target, from the sections below (each carries its date and details):"
        f" {len(found) - missed} of {len(found)} met.",
        "",
        "| what | target | measured | met? |",
        "|---|---|---|---|",
        *(row.line() for row in found),
    ]


def rows(sections: Mapping[str, list[str]]) -> Iterator[Row]:
    """Every judged target of every section, in the sections' order."""
    for heading, lines in sections.items():
        name = heading.removeprefix("## ").strip()
        for header, body in _tables(lines):
            yield from _judged(name, header, body)


def _tables(lines: Iterable[str]) -> Iterator[tuple[list[str], list[list[str]]]]:
    """Each markdown table of a section: its header cells and its rows' cells."""
    table: list[list[str]] = []
    for line in [*lines, ""]:
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
            continue
        if len(table) > 2:
            yield table[0], table[2:]
        table = []


def _judged(section: str, header: list[str], body: list[list[str]]) -> Iterator[Row]:
    if header == ["target", "measured", "verdict"]:
        for what, measured, verdict in body:
            if verdict:
                name, target = _split(what)
                yield Row(section, name, target, _first(measured), verdict == "met")
    elif header == ["measure", "before", "after", "target", "verdict"]:
        for what, _, after, target, verdict in body:
            yield Row(section, what, target, after, verdict == "met")
    elif header == ["measure", "figure", "target"]:
        for what, figure, target in body:
            if judged := _JUDGED.match(target):
                met = judged["verdict"] == "meets"
                yield Row(section, what, judged["target"], figure, met)
    elif header[-1].startswith("target ") and header[:3] == ["call", "p50", "p95"]:
        yield _calls(section, header[-1].removeprefix("target "), body)


def _calls(section: str, target: str, body: list[list[str]]) -> Row:
    judged = [row for row in body if "for reference" not in row[0]]
    slowest = max(judged, key=lambda row: float(row[2].split()[0]))
    met = all(row[3] == "meets" for row in judged)
    what = f"each of {len(judged)} calls, {target.split()[0]}"
    measured = f"slowest {slowest[2]} ({slowest[0]})"
    return Row(section, what, target.removeprefix(target.split()[0]).strip(), measured, met)


def _split(what: str) -> tuple[str, str]:
    """``gateway/floor throughput, plain c=32 >= 70%`` -> its name and its threshold."""
    parts = _COMPARISON.split(what, maxsplit=1)
    if len(parts) == 2:
        return parts[0].rstrip(","), parts[1]
    if trailing := _TRAILING.match(what):
        return trailing["what"], trailing["target"]
    return what, ""


def _first(measured: str) -> str:
    """The measured cell's headline: what comes before its parenthesised details."""
    return measured.split(" (", 1)[0]
