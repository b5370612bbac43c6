"""The smoke command's pure parts: finding a shell's scripts, judging histograms and labels,
usage objects, and how the runner counts (a note is never a pass)."""

from __future__ import annotations

import io

import pytest
from prometheus_client.samples import Sample

from fleet_core.cli.smoke.console import scripts
from fleet_core.cli.smoke.metrics import bucket_errors, key_labels
from fleet_core.cli.smoke.openai_compat import usage_ok
from fleet_core.cli.smoke.running import Runner, Stop


@pytest.mark.parametrize(
    ("shell", "found"),
    [
        (
            '<script type="module" crossorigin src="/assets/index-Ab1.js"></script>',
            ["/assets/index-Ab1.js"],
        ),
        ("<script type=module src=/assets/a.js></script>", ["/assets/a.js"]),
        ('<link rel="modulepreload" href="./assets/vendor.js?v=1">', ["/assets/vendor.js"]),
        (
            '<script src="/assets/a.js"></script><script src="/assets/a.js"></script>',
            ["/assets/a.js"],
        ),
        ('<link rel="stylesheet" href="/assets/app.css"><p>no build</p>', []),
    ],
)
def test_scripts_a_shell_references(shell: str, found: list[str]) -> None:
    assert scripts(shell) == found


def _bucket(le: str, value: float) -> Sample:
    return Sample("h_bucket", {"model": "m", "le": le}, value)


def test_bucket_errors_find_a_decrease_and_a_wrong_count() -> None:
    good = [
        _bucket("0.1", 1),
        _bucket("1.0", 3),
        _bucket("+Inf", 3),
        Sample("h_count", {"model": "m"}, 3),
    ]
    assert bucket_errors(good) == []
    assert bucket_errors([_bucket("0.1", 4), *good[1:]]) != []
    assert bucket_errors([*good[:3], Sample("h_count", {"model": "m"}, 5)]) != []


def test_key_labels_find_a_key_or_its_secret_part() -> None:
    key = "acme/research/s3cr3t-value-123"
    clean = Sample("fleet_requests_total", {"tenant": "acme", "project": "research"}, 1)
    assert key_labels([clean], [key]) == []
    assert key_labels([Sample("x", {"who": key}, 1)], [key]) == ["x{who=...}"]
    assert key_labels([Sample("x", {"k": "s3cr3t-value-123"}, 1)], [key]) == ["x{k=...}"]
    assert key_labels([Sample("x", {"api_key": "k_0123"}, 1)], [key]) == ["x{api_key=...}"]


@pytest.mark.parametrize(
    ("usage", "ok"),
    [
        ({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}, True),
        ({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 6}, False),
        ({"prompt_tokens": 3, "total_tokens": 3}, False),
        (None, False),
    ],
)
def test_usage_ok(usage: object, ok: bool) -> None:
    assert usage_ok(usage) is ok


def test_a_note_is_not_a_pass_and_a_failure_stops_the_run() -> None:
    out = io.StringIO()
    runner = Runner(out=out)
    runner.check("Area", "passes", True, "fine")
    runner.note("Area", "cannot be seen here", "why")
    assert runner.summary() == "1/1 checks passed, 0 failed, 1 notes"
    with pytest.raises(Stop):
        runner.check("Area", "fails", False, "what was seen")
    assert runner.summary().startswith("FAILED: 1/2 checks passed, 1 failed")
    assert [line.split()[-1] for line in out.getvalue().splitlines()] == ["fine", "why", "seen"]
    going = Runner(keep_going=True, out=io.StringIO())
    assert going.check("Area", "fails", False, "x") is False
    assert going.failed == 1
