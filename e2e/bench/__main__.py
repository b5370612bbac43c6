"""Run every benchmark and write docs/benchmarks.md (``make bench``)."""

from __future__ import annotations

from bench import gateway_bench


def main() -> None:
    gateway_bench.write_report([gateway_bench.report(gateway_bench.run())])


if __name__ == "__main__":
    main()
