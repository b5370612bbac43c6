"""``fleet-serving run``: flags become settings; a command line that cannot work gets one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_serving.errors import ConfigError
from fleet_serving.settings import parse_args, parse_duration


@pytest.fixture
def token(tmp_path: Path) -> str:
    """``--report-token-file=…``: the operator credential, as its mounted Secret holds it."""
    path = tmp_path / "token"
    path.write_text("fsc_operator-credential\n")
    return f"--report-token-file={path}"


def test_flags_become_settings(token: str) -> None:
    settings = parse_args(
        ["run", "--report-to=http://cp:8081/", "--cluster", "eu-1", "--namespace", "models",
         "--report-interval", "45s", "--resync", "2m", token, "--engine-token-secret=engines"],
        {"KUBECONFIG": "/k"},
    )  # fmt: skip
    assert settings.reporter.token is not None
    assert settings.reporter.token.read() == "fsc_operator-credential"
    assert "fsc_operator-credential" not in repr(settings)  # only the file's path is kept
    assert settings.engine_token_secret == "engines"
    assert settings.reporter.url == "http://cp:8081"
    assert settings.reporter.cluster_id == "eu-1"
    assert settings.reporter.interval == 45.0
    assert settings.namespaces == ("models",)
    assert settings.resync_seconds == 120.0
    assert settings.kubeconfig == "/k"


def test_defaults_watch_all_namespaces(token: str) -> None:
    settings = parse_args(["run", "--report-to=https://cp", token], {})
    assert settings.namespaces == ()
    assert settings.engine_token_secret == "fleet-engine-token"
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
        (["run", "--report-to=http://cp", "--engine-token-secret=A_B"], "not a Secret name"),
        (["serve"], "invalid choice"),
    ],
)
def test_bad_command_lines_are_refused(argv: list[str], message: str, token: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([*argv, token] if argv != ["serve"] else argv, {})


@pytest.mark.parametrize("content", [None, "", "\n"])
def test_the_operator_refuses_to_start_without_its_credential(
    tmp_path: Path, content: str | None
) -> None:
    """Closed by default: no file, or an empty one, is a refusal in one line, not an operator
    that would report anonymously and be told 401 forever."""
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=r"--report-token-file .* is missing, unreadable"):
        parse_args(["run", "--report-to=http://cp", f"--report-token-file={path}"], {})
    with pytest.raises(ConfigError, match="--report-token-file"):
        parse_args(["run", "--report-to=http://cp"], {})


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("2m", 120), ("500ms", 0.5),
                                               ("1h", 3600), ("10", 10)])  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_a_bad_flag_exits_2_with_one_line(token: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fleet_serving", "run", "--report-to=http://cp", token, "--bogus"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == "fleet-serving: unrecognized arguments: --bogus (see --help)\n"
    assert result.stdout == ""


def test_missing_credentials_exit_2_with_one_line(token: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fleet_serving", "run", "--report-to=http://cp", token],
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
