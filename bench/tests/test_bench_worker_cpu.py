"""The gateway bench's `--workers 2` CPU table: the ratio the cores allow, from CPU per request.

One worker is held to one core; two share both cores with the stub and the generator, so on an
otherwise idle machine two workers reach at most 2 x one / (two + stub + generator) times one
worker's throughput (ADR 0002). The table states that bound beside the measured ratio.
"""

from __future__ import annotations

from bench import gateway_bench as gb


def _cell(rps: float, cpu: float, engine: float, generator: float) -> gb.Cell:
    return {"rps": rps, "cpu_us": cpu, "engine_us": engine, "generator_us": generator}


def _samples(one: list[gb.Cell], two: list[gb.Cell]) -> gb.Samples:
    return {
        gb.GATEWAY: dict.fromkeys(gb.THROUGHPUT, one),
        gb.WORKERS: dict.fromkeys(gb.THROUGHPUT, two),
    }


def test_the_allowed_ratio_is_two_cores_over_the_cpu_of_every_process() -> None:
    one = [_cell(2500, 400, 60, 50), _cell(2400, 380, 60, 50), _cell(2600, 420, 60, 50)]
    two = [_cell(3500, 440, 50, 40), _cell(3600, 430, 60, 40), _cell(3400, 450, 70, 40)]
    rows = [line for line in gb._worker_cpu(_samples(one, two)) if line.startswith("| plain c=32")]
    # medians: one worker 400 us; two 440 us; stub 60 us; generator 40 us -> 800 / 540
    assert rows == ["| plain c=32 | 400 | 440 | 60 | 40 | 1.48x | 1.40x |"]


def test_cells_measured_without_cpu_are_left_out() -> None:
    bare = [{"rps": 1000.0}]
    lines = gb._worker_cpu(_samples(bare, bare))
    assert not any(line.startswith("| plain") or line.startswith("| stream") for line in lines)


def test_throughput_per_core_is_the_floors_cpu_per_request_over_the_gateways() -> None:
    floor = [_cell(5000, 150, 30, 30), _cell(4000, 200, 30, 30), _cell(4500, 180, 30, 30)]
    gateway = [_cell(3000, 200, 30, 30), _cell(3500, 250, 30, 30), _cell(2000, 300, 30, 30)]
    samples = {gb.FLOOR: dict.fromkeys(gb.THROUGHPUT, floor)}
    samples[gb.GATEWAY] = dict.fromkeys(gb.THROUGHPUT, gateway)
    # round by round 150/200, 200/250, 180/300: 75%, 80%, 60% -> median 75%
    assert gb._per_core(samples, "plain c=32") == "per CPU second 75%"


def test_throughput_per_core_says_when_no_cpu_was_read() -> None:
    bare = [{"rps": 1000.0}]
    samples = {gb.FLOOR: dict.fromkeys(gb.THROUGHPUT, bare)}
    samples[gb.GATEWAY] = dict.fromkeys(gb.THROUGHPUT, bare)
    assert gb._per_core(samples, "stream c=64") == "CPU not read"


def test_each_workers_verdict_states_the_spread_of_its_rounds() -> None:
    one = [_cell(2000, 400, 60, 50), _cell(2500, 400, 60, 50), _cell(2000, 400, 60, 50)]
    two = [_cell(3000, 440, 50, 40), _cell(3000, 440, 50, 40), _cell(3400, 440, 50, 40)]
    rows = gb._worker_verdicts(_samples(one, two))
    # round by round 1.50x, 1.20x, 1.70x -> median 1.50x
    assert (
        rows[0]
        == "| --workers 2 / one worker, plain c=32 >= 1.4x | 1.50x (3 rounds, 1.20x-1.70x) | met |"
    )
