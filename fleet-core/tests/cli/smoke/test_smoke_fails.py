"""Each area of ``fleet smoke`` fails on a deliberately broken setup (the check can fail), and the
console area passes on both a built console and the placeholder page. Everything is real HTTP over
loopback: small broken servers (``fakes``), or a real ``fleet-gateway --demo`` with auth or limits
off. The whole command passing against the real system is e2e/tests/test_make_dev.py."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleet_testing import processes
from fleet_testing.asgi import serving

from . import fakes


async def _start_smoke(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fleet_core.cli.smoke",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )


async def smoke(*args: str) -> tuple[int, str]:
    process = await _start_smoke(*args)
    out, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode()


def line(output: str, what: str) -> str:
    found = [row for row in output.splitlines() if what in row]
    assert found, f"no line for {what!r} in:\n{output}"
    return found[0]


def verdict(output: str, what: str) -> str:
    """``ok``, ``FAIL`` or ``note`` of the line about ``what``."""
    after = line(output, what).split(what, 1)[1].split()
    return next(word for word in after if word in ("ok", "FAIL", "note"))


@pytest.fixture
def admin_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin-token"
    path.write_text("fake-admin-token\n")
    return path


@pytest.fixture
async def open_gateway(tmp_path: Path) -> AsyncIterator[str]:
    """A real ``fleet-gateway --demo`` with neither auth nor limits: anyone is served."""
    with processes.processes(tmp_path) as procs:
        yield await asyncio.to_thread(processes.gateway, procs, {}, ["--demo"])


def _against(
    gateway: str, control_plane: str, admin: Path, area: str, *, keep_going: bool = True
) -> tuple[str, ...]:
    return (
        "--gateway",
        gateway,
        "--control-plane",
        control_plane,
        "--admin-token-file",
        str(admin),
        "--hub",
        f"{control_plane}/hub",
        "--only",
        area,
        *(("--keep-going",) if keep_going else ()),
    )


@pytest.mark.parametrize("shell", [fakes.SHELL, fakes.PLACEHOLDER], ids=["built", "placeholder"])
async def test_the_console_area_passes_built_or_not(shell: bytes) -> None:
    async with serving(fakes.console_app(shell=shell, catch_all_assets=False)) as url:
        code, out = await smoke("--gateway", url, "--only", "console")
    assert code == 0, out
    if shell == fakes.SHELL:
        assert verdict(out, "/assets/app-1.js is JavaScript") == "ok"
    else:
        assert "no assets referenced" in line(out, "scripts the shell references")


async def test_a_shell_served_for_a_referenced_script_fails_and_stops_the_run() -> None:
    async with serving(fakes.console_app(shell=fakes.SHELL, catch_all_assets=True)) as url:
        code, out = await smoke("--gateway", url, "--only", "console,cors")
    assert code == 1
    assert verdict(out, "/assets/app-1.js is JavaScript, not the shell") == "FAIL"
    assert "CORS" not in out.split("FAIL", 1)[1], "the run went on after the first failure"
    assert out.strip().splitlines()[-1].startswith("FAILED: ")


async def test_a_placeholder_whose_gateway_serves_the_shell_for_assets_fails() -> None:
    async with serving(fakes.console_app(shell=fakes.PLACEHOLDER, catch_all_assets=True)) as url:
        code, out = await smoke("--gateway", url, "--only", "console", "--keep-going")
    assert code == 1
    assert verdict(out, "an unknown /assets/*.js is a 404, not the shell") == "FAIL"


async def test_cors_fails_when_every_origin_is_allowed() -> None:
    async with serving(fakes.open_cors_app()) as url:
        code, out = await smoke(
            "--gateway", url, "--control-plane", url, "--only", "cors", "--keep-going"
        )
    assert code == 1
    assert verdict(out, "gateway: a loopback origin is allowed") == "ok"
    assert verdict(out, "gateway: a foreign origin is refused") == "FAIL"


async def test_openai_fails_on_streams_without_done_and_with_unasked_usage(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("fk_whatever\n")
    async with serving(fakes.Gateway().app()) as url:
        code, out = await smoke(
            "--gateway", url, "--key-file", str(key), "--only", "openai", "--keep-going"
        )
    assert code == 1
    assert verdict(out, "a chat completion from 'fake' has content") == "ok"
    assert verdict(out, "a stream sends many frames, then [DONE]") == "FAIL"
    assert verdict(out, "a stream that did not ask for usage gets none") == "FAIL"


async def test_auth_fails_on_a_gateway_serving_anonymous_traffic(
    open_gateway: str, admin_file: Path
) -> None:
    plane = fakes.ControlPlane()
    async with serving(plane.app()) as control:
        code, out = await smoke(
            *_against(open_gateway, control, admin_file, "auth,limits", keep_going=False)
        )
    assert code == 1
    assert verdict(out, "a missing key is a 401") == "FAIL"
    assert "Rate limits" not in out, "the run stops at the first failure"
    assert len(plane.deactivated) == 3, "every throwaway tenant is deactivated after a failure"
    assert "cleanup: deactivated 3 throwaway tenant(s)" in out


async def _failing_area(gateway: str, control_plane: str, admin: Path, area: str) -> str:
    """The output of ``fleet smoke --only AREA --keep-going``, which must exit 1."""
    code, out = await smoke(*_against(gateway, control_plane, admin, area))
    assert code == 1
    return out


def _assert_verdicts(out: str, expected: dict[str, str]) -> None:
    for what, want in expected.items():
        assert verdict(out, what) == want, what


@pytest.mark.parametrize(
    ("area", "expected"),
    [
        pytest.param(
            "limits",
            {
                "request 4, on the tenant's other key, is refused": "FAIL",
                "a token ceiling bites before the request ceiling": "FAIL",
            },
            id="rate-limits-fail-without-limits",
        ),
        pytest.param(
            "budgets",
            {
                "it appears in /api/v1/usage": "FAIL",
                "a spent budget rule refuses, naming the rule": "FAIL",
            },
            id="budgets-fail-when-the-ledger-shows-nothing",
        ),
    ],
)
async def test_an_area_fails_on_a_gateway_without_auth_or_limits(
    open_gateway: str, admin_file: Path, area: str, expected: dict[str, str]
) -> None:
    async with serving(fakes.ControlPlane().app()) as control:
        out = await _failing_area(open_gateway, control, admin_file, area)
    _assert_verdicts(out, expected)


@pytest.mark.parametrize(
    ("area", "expected"),
    [
        pytest.param(
            "metrics",
            {
                "/metrics without a credential is refused": "ok",
                "no series is labelled with an API key": "FAIL",
                "histogram buckets never decrease": "FAIL",
            },
            id="metrics-fail-on-a-key-label-and-a-decreasing-histogram",
        ),
        pytest.param(
            "engines",
            {
                "vLLM refuses compute capability below 7.5": "note",
                "published load signals are in range": "FAIL",
            },
            id="engine-profiles-fail-on-an-out-of-range-load-signal",
        ),
    ],
)
async def test_an_area_fails_on_a_broken_gateway(
    admin_file: Path, area: str, expected: dict[str, str]
) -> None:
    async with serving(fakes.Gateway().app()) as gateway, serving(fakes.ControlPlane().app()) as cp:
        out = await _failing_area(gateway, cp, admin_file, area)
    _assert_verdicts(out, expected)


@pytest.mark.parametrize(
    ("area", "expected", "in_lines"),
    [
        pytest.param(
            "inventory",
            {
                "counts are recomputed from the node list": "FAIL",
                "Scheduling keeps its reason": "ok",
                "cluster prod-1: counts match its node list": "FAIL",
            },
            {"counts are recomputed": "'gpus': 999"},
            id="inventory-fails-when-a-reports-total-is-trusted",
        ),
        pytest.param(
            "formats",
            {
                "safetensors weights fit vllm": "ok",
                "safetensors weights are refused by llamacpp": "FAIL",
                "gguf weights are refused by vllm": "FAIL",
            },
            {},
            id="weight-formats-fail-when-every-engine-fits",
        ),
        pytest.param(
            "costs",
            {
                "a cost rate round-trips exactly": "FAIL",
                "before it is over is refused": "ok",
                "closing 2000-01 (nobody observed it)": "ok",
            },
            {},
            id="the-cost-pool-fails-when-a-rate-is-rounded",
        ),
    ],
)
async def test_an_area_fails_on_a_broken_control_plane(
    admin_file: Path, area: str, expected: dict[str, str], in_lines: dict[str, str]
) -> None:
    async with serving(fakes.ControlPlane().app()) as cp:
        out = await _failing_area(cp, cp, admin_file, area)
    _assert_verdicts(out, expected)
    for what, shown in in_lines.items():
        assert shown in line(out, what)


async def test_sigterm_mid_run_still_deactivates_the_tenants(
    open_gateway: str, admin_file: Path
) -> None:
    """Stopped while it waits for the ledger (which never shows anything here)."""
    plane = fakes.ControlPlane()
    async with serving(plane.app()) as control:
        process = await _start_smoke(*_against(open_gateway, control, admin_file, "budgets"))
        assert process.stdout is not None
        seen = b""
        while b"a request of a fresh tenant is served" not in seen:
            seen += await asyncio.wait_for(process.stdout.readline(), timeout=30)
        process.terminate()
        rest, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    out = (seen + rest).decode()
    assert process.returncode == 1
    assert "interrupted: cleaning up" in out
    assert "it appears in /api/v1/usage" not in out, "stopped only after the wait"
    assert out.strip().splitlines()[-1].startswith("INTERRUPTED: ")
    assert plane.deactivated == [line(out, "fleet smoke").split()[2].rstrip(":") + "-budget"]


async def test_weight_formats_are_skipped_with_a_reason_without_a_hub(admin_file: Path) -> None:
    """A control plane pulling from the real hub: the synthetic repositories are not there."""
    async with serving(fakes.ControlPlane().app()) as cp:
        args = [
            a for a in _against(cp, cp, admin_file, "formats") if a not in ("--hub", f"{cp}/hub")
        ]
        code, out = await smoke(*args)
    assert code == 0, out
    assert "no --hub given: skipped" in line(out, "the synthetic hub's repositories")
