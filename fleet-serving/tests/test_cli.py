"""``fleet-serving run``: flags become settings; a command line that cannot work gets one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fleet_serving.errors import ConfigError
from fleet_serving.settings import parse_args, parse_duration


def test_flags_become_settings() -> None:
    settings = parse_args(
        ["run", "--report-to=http://cp:8081/", "--cluster", "eu-1", "--namespace", "models",
         "--report-interval", "45s", "--resync", "2m"],
        {"KUBECONFIG": "/k"},
    )  # fmt: skip
    assert settings.reporter.url == "http://cp:8081"
    assert settings.reporter.cluster_id == "eu-1"
    assert settings.reporter.interval == 45.0
    assert settings.namespaces == ("models",)
    assert settings.resync_seconds == 120.0
    assert settings.kubeconfig == "/k"


def test_defaults_watch_all_namespaces() -> None:
    settings = parse_args(["run", "--report-to=https://cp"], {})
    assert settings.namespaces == ()
    assert settings.reporter.interval == 30.0
    assert settings.kubeconfig is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run"], "--report-to"),
        (["run", "--report-to=cp:8081"], r"not an http\(s\) URL"),
        (["run", "--report-to=http://cp", "--report-interval=soon"], "not a duration"),
        (["run", "--report-to=http://cp", "--report-interval=0s"], "not a duration"),
        (["run", "--report-to=http://cp", "--namespace=a", "--all-namespaces"], "not allowed"),
        (["run", "--report-to=http://cp", "--cluster="], "--cluster"),
        (["serve"], "invalid choice"),
    ],
)
def test_bad_command_lines_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args(argv, {})


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("2m", 120), ("500ms", 0.5),
                                               ("1h", 3600), ("10", 10)])  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_a_bad_flag_exits_2_with_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fleet_serving", "run", "--report-to=http://cp", "--bogus"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == "fleet-serving: unrecognized arguments: --bogus (see --help)\n"
    assert result.stdout == ""


def test_missing_credentials_exit_2_with_one_line(tmp_path: object) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fleet_serving", "run", "--report-to=http://cp"],
        capture_output=True, text=True, timeout=60, check=False,
        env={"KUBECONFIG": "/nonexistent/kubeconfig", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 2
    first = json.loads(result.stderr.splitlines()[0])  # structured logs: one JSON object a line
    assert first["message"] == "starting"
    assert first["report_to"] == "http://cp"
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("fleet-serving: no Kubernetes credentials")
    assert "KUBECONFIG" in last
