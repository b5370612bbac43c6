"""The instructions bench (``FLEET_BENCH_ONLY=instructions``): what it reads from a callgrind
dump, the verdicts it states, and one real count of a server under callgrind (``make e2e``,
where valgrind and Go are required: without them this fails rather than skips)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import pytest

from bench import instructions_bench as bench
from bench import stub
from bench.gateway_bench import process
from fleet_testing.ports import free_port


def test_a_dump_is_read_by_its_totals_line_not_its_summary(tmp_path: Path) -> None:
    """callgrind writes a dump's ``summary:`` before its costs, as 0 (seen on valgrind 3.19)."""
    dump = tmp_path / "callgrind.1"
    dump.write_text("part: 1\nevents: Ir\nsummary: 0\nfn=(1) main\n5 12\ntotals: 4321\n")
    assert bench.dumped_total(dump) == 4321
    (tmp_path / "empty").write_text("events: Ir\nsummary: 0\n")
    with pytest.raises(SystemExit):
        bench.dumped_total(tmp_path / "empty")


def _counts(
    floor: float, gateway: float, database: float, ruleless: float | None = None
) -> bench.Counts:
    def cell(per_request: float) -> dict[str, float]:
        return {"instructions": per_request * 1000, "requests": 1000.0, "redis_scripts": 10.0}

    return {
        bench.FLOOR: {c: cell(floor) for c in bench.FLOOR_CELLS},
        bench.GATEWAY: {c: cell(gateway) for c in bench.FLOOR_CELLS},
        bench.DB_MODE: {c: cell(database) for c in bench.DB_CELLS},
        bench.FULL_SPEED: {c: cell(0) for c in bench.DB_CELLS},
        **(
            {}
            if ruleless is None
            else {bench.RULELESS: {c: cell(ruleless) for c in bench.DB_CELLS}}
        ),
    }


@pytest.mark.parametrize(
    ("floor", "database", "floor_met", "database_met"),
    [(700, 1177, True, False), (699, 1176, False, True)],  # 70%; 84.96% and 85.03%
)
def test_the_verdicts_are_the_ratios_of_instructions_per_request(
    floor: float, database: float, floor_met: bool, database_met: bool
) -> None:
    lines = bench.report((_counts(floor, 1000, database), "", []))
    floor_rows = [line for line in lines if line.startswith("| floor / gateway")]
    database_rows = [line for line in lines if line.startswith("| no auth / database mode")]
    assert len(floor_rows) == len(bench.FLOOR_CELLS)
    assert len(database_rows) == len(bench.DB_CELLS)
    assert all(row.endswith("| met |") == floor_met for row in floor_rows)
    assert all(row.endswith("| met |") == database_met for row in database_rows)


def test_a_tenant_with_no_budget_rule_is_judged_beside_the_one_under_three() -> None:
    lines = bench.report((_counts(700, 1000, 1200, ruleless=1100), "", []))
    rules = [line for line in lines if line.startswith("| no auth / database mode (three")]
    ruleless = [line for line in lines if line.startswith("| no auth / database mode (no")]
    assert len(rules) == len(ruleless) == len(bench.DB_CELLS)
    assert all(row.endswith("| 83% | NOT met |") for row in rules)
    assert all(row.endswith("| 91% | met |") for row in ruleless)


def test_without_its_tools_the_section_says_skipped_and_why() -> None:
    lines = bench.report(({}, "skipped: `valgrind` is not installed", []))
    assert any("skipped: `valgrind` is not installed" in line for line in lines)


@pytest.mark.e2e
def test_a_server_under_callgrind_is_counted_per_request_it_forwarded() -> None:
    """The floor proxy under callgrind for two short cells: every request it forwarded is
    counted by the stub, and what it executed per request is a plausible amount."""
    assert bench.missing() == "", bench.missing()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        port = free_port()
        engine = f"http://127.0.0.1:{port}"
        stack.enter_context(process(stub.command(port, "bench"), engine + "/health"))
        args = ["bench.aiohttp_proxy", "PORT", engine]
        target = stack.enter_context(
            bench._under_callgrind("floor", args, None, {}, tmp / "callgrind.floor")
        )
        counted = [bench.count(target, "plain c=4", engine, None, (1, 3)) for _ in range(2)]
    for figures in counted:
        assert figures["requests"] > 20
        assert 100_000 < bench.per_request(figures) < 5_000_000
    first, second = (bench.per_request(f) for f in counted)
    assert abs(first - second) / first < 0.25  # the same work, counted twice
