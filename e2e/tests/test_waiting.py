"""The harness's one way to wait: `eventually` with a plain or a coroutine check, its blocking
twin, and `until_answers` for a process's URL."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fleet_testing.ports import free_port
from fleet_testing.waiting import eventually, eventually_blocking, until_answers


async def test_eventually_returns_what_a_plain_check_found() -> None:
    calls = iter([None, 0, "found"])
    assert await eventually(lambda: next(calls), within=5, interval=0.001) == "found"


async def test_eventually_awaits_a_coroutine_check() -> None:
    seen: list[int] = []

    async def check() -> list[int] | None:
        seen.append(1)
        return seen if len(seen) == 3 else None

    assert await eventually(check, within=5, interval=0.001) == [1, 1, 1]


async def test_a_wait_that_runs_out_names_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match=r"not within 0\.05 s: the answer"):
        await eventually(lambda: None, within=0.05, what="the answer")


async def test_without_what_the_failure_names_the_calling_line() -> None:
    with pytest.raises(AssertionError, match=r"test_waiting\.py:\d+: .*eventually\(lambda: False"):
        await eventually(lambda: False, within=0.01)


def test_the_blocking_twin_waits_the_same_way() -> None:
    calls = iter([False, False, True])
    assert eventually_blocking(lambda: next(calls), within=5, interval=0.001) is True
    with pytest.raises(AssertionError, match=r"not within 0\.01 s: .*eventually_blocking"):
        eventually_blocking(lambda: None, within=0.01)


def test_until_answers_fails_at_once_when_the_process_exits() -> None:
    argv = [sys.executable, "-c", "import sys; sys.exit('no config')"]
    with subprocess.Popen(argv, stderr=subprocess.PIPE) as process:
        url = f"http://127.0.0.1:{free_port()}/health"
        with pytest.raises(AssertionError, match="the server exited with 1: no config"):
            until_answers(url, process, within=30, what="the server")


def test_until_answers_returns_once_the_url_answers() -> None:
    port = free_port()
    argv = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as process:
        try:
            until_answers(f"http://127.0.0.1:{port}/", process, within=30)
        finally:
            process.terminate()
