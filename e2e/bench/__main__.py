"""Run every benchmark and write docs/benchmarks.md (``make bench``).

``FLEET_BENCH_ONLY=gateway``, ``=admission`` or ``=ledger`` runs one section.
"""

from __future__ import annotations

import os

from bench import admission_bench, gateway_bench, ledger_bench


def main() -> None:
    only = os.environ.get("FLEET_BENCH_ONLY", "")
    sections = []
    if only in ("", "gateway"):
        sections.append(gateway_bench.report(gateway_bench.run()))
    if only in ("", "admission"):
        sections.append(admission_bench.report(admission_bench.run()))
    if only in ("", "ledger"):
        sections.append(ledger_bench.report(ledger_bench.run()))
    gateway_bench.write_report(sections)


if __name__ == "__main__":
    main()
