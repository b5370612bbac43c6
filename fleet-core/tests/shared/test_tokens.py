"""Bearer secrets from the environment or a file, and how clients find make dev's token."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_core.shared.errors import ConfigError
from fleet_core.shared.tokens import client_token, secret_from_env

TOKEN = "x" * 40


def test_a_variable_or_the_first_line_of_its_file(tmp_path: Path) -> None:
    assert secret_from_env({"T": TOKEN}, "T") == TOKEN
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\nignored\n")
    assert secret_from_env({"T_FILE": str(path)}, "T") == TOKEN
    assert secret_from_env({}, "T") is None
    assert secret_from_env({"T": ""}, "T") is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"T": TOKEN, "T_FILE": "/x"}, "both T and T_FILE are set"),
        ({"T_FILE": "/nonexistent/token"}, "T_FILE=/nonexistent/token cannot be read"),
        ({"T": "short"}, "T is shorter than 32 characters"),
    ],
)
def test_what_cannot_work_is_refused_in_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        secret_from_env(env, "T")
    assert "\n" not in str(refused.value)
    assert TOKEN not in str(refused.value)


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        secret_from_env({"T_FILE": str(tmp_path / "token")}, "T")


def test_clients_fall_back_to_the_token_make_dev_keeps(tmp_path: Path) -> None:
    assert client_token({}, cwd=tmp_path) is None
    (tmp_path / ".dev").mkdir()
    (tmp_path / ".dev" / "admin-token").write_text(f"{TOKEN}\n")
    assert client_token({}, cwd=tmp_path) == TOKEN
    other = "y" * 40
    assert client_token({"FLEET_TOKEN": other}, cwd=tmp_path) == other
