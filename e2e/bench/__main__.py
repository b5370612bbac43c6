"""Run every benchmark and write docs/benchmarks.md (``make bench``)."""

from __future__ import annotations

import sys

from bench import gateway_bench


def main() -> None:
    sections = [gateway_bench.run()]
    gateway_bench.write_report(sections)


if __name__ == "__main__":
    sys.exit(main())
