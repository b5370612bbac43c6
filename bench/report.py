"""docs/benchmarks.md, written from the sections a run measured: each section rerun replaces the
one of its heading, the others stay as the last run that measured them left them, and the file
opens with the table of every judged target (`headline`) rebuilt from all of them."""

from __future__ import annotations

import contextlib
import os
import platform
import time
from pathlib import Path

from bench import generator, headline, stub


def verdict(ok: bool) -> str:
    """A target's verdict cell."""
    return "met" if ok else "NOT met"


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {platform.system()}"
    )


TARGETS = "## Targets"
METHOD = "## Method"
GENERATED = (TARGETS, METHOD)
"""Sections written afresh every time, from the others and from the code."""


def write(sections: list[list[str]], *, path: Path, seconds: float) -> None:
    """Write docs/benchmarks.md: the sections just run replace those of the same heading; the
    others stay as the last run that measured them left them (each section carries its date).
    It opens with the table of every judged target (`headline`), rebuilt from all of them."""
    stamp = f"_Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine()}._"
    fresh = {section[0]: [section[0], "", stamp, *section[1:]] for section in sections}
    kept = sections_of(path.read_text()) if path.exists() else {}
    merged = {h: lines for h, lines in {**kept, **fresh}.items() if h not in GENERATED}
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench`; every figure comes from one run on one machine, with its",
        "baseline measured in that same run. Absolute numbers move by 20-40% between runs on this",
        "shared machine; compare the ratios. `FLEET_BENCH_ONLY=<section>` reruns one section.",
        "",
        *headline.table(merged),
        "",
        METHOD,
        "",
        f"- Each cell: {seconds:g} s of closed-loop load after a warm-up, from a load generator in",
        "  its own process; the engine adds no delay and replies 11 tokens (max_tokens 16).",
        *generator.PREAMBLE,
        *stub.PREAMBLE,
        "",
    ]
    for section in merged.values():
        if lines[-1]:  # a kept section read from the file's end has no blank line after it
            lines.append("")
        lines += section
    text = "\n".join(lines).rstrip("\n") + "\n"  # one newline at the end, whichever came last
    path.write_text(text)
    print(text, end="")


def sections_of(text: str) -> dict[str, list[str]]:
    """``## heading`` -> its lines, from an earlier report."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = found.setdefault(line, [])
        if current is not None:
            current.append(line)
    return found
