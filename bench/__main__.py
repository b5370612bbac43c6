"""Run every benchmark and write docs/benchmarks.md (``make bench``).

``FLEET_BENCH_ONLY=gateway``, ``=admission``, ``=ledger``, ``=database``, ``=pull``, ``=costs``,
``=console``, ``=operator`` or ``=routing`` runs one section (the other
sections of docs/benchmarks.md are kept as they were). ``FLEET_BENCH_ONLY=soak`` runs the
30-minute soak (``FLEET_BENCH_SOAK_S`` shortens it), which a plain ``make bench`` leaves out.
"""

from __future__ import annotations

import os

from bench import (
    admission_bench,
    console_bench,
    costs_bench,
    database_bench,
    gateway_bench,
    generator,
    ledger_bench,
    operator_bench,
    pull_bench,
    report,
    routing_bench,
    soak_bench,
)


def main() -> None:
    only = os.environ.get("FLEET_BENCH_ONLY", "")
    sections = []
    if only in ("", "gateway"):
        sections.append([*gateway_bench.report(gateway_bench.run()), generator.describe(), ""])
    if only in ("", "admission"):
        sections.append(admission_bench.report(admission_bench.run()))
    if only in ("", "ledger"):
        sections.append(ledger_bench.report(ledger_bench.run()))
    if only in ("", "database"):
        sections.append(database_bench.report(database_bench.run()))
    if only in ("", "pull"):
        sections.append(pull_bench.report(pull_bench.run()))
    if only in ("", "costs"):
        sections.append(costs_bench.report(costs_bench.run()))
    if only in ("", "console"):
        sections.append(console_bench.report(console_bench.run()))
    if only in ("", "operator"):
        sections.append(operator_bench.report(operator_bench.run()))
    if only in ("", "routing"):
        sections.append(routing_bench.report(routing_bench.run()))
    if only == "soak":
        sections.append(soak_bench.report(soak_bench.run()))
    report.write(
        sections, path=gateway_bench.ROOT / "docs" / "benchmarks.md", seconds=gateway_bench.SECONDS
    )


if __name__ == "__main__":
    main()
