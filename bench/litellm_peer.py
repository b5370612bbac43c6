"""LiteLLM's proxy as a peer in the gateway benchmark, installed by the bench itself.

A pinned ``litellm[proxy]`` goes into a virtual environment of its own under the per-user cache
(``${XDG_CACHE_HOME:-~/.cache}/fleet/litellm-<version>``, ~750 MB, made once with uv from PyPI),
never into the project's environment. When it cannot be installed or does not start, the bench
says ``skipped: <why>`` instead of a figure. One worker, the stub engine as an OpenAI-compatible
upstream, its master key as the load generator's bearer key; no database, no cost map fetch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["KEY", "VERSION", "command", "environment", "install"]

VERSION = "1.108.7"
KEY = "sk-fleet-bench-litellm"


def _home() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "fleet" / f"litellm-{VERSION}"


def install() -> Path | str:
    """The venv's ``litellm`` program, installing it first if needed; or why it cannot be."""
    home = _home()
    program, complete = home / "bin" / "litellm", home / ".complete"
    if complete.exists():
        return program
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        return "uv is not installed (make bench installs it into .venv)"
    shutil.rmtree(home, ignore_errors=True)  # a half-made venv (scripts name their own path)
    steps = (
        [uv, "venv", "--quiet", "--python", sys.executable, str(home)],
        [uv, "pip", "install", "--quiet", "--python", str(home / "bin" / "python"),
         f"litellm[proxy]=={VERSION}"],
    )  # fmt: skip
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=1200, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"installing litellm[proxy]=={VERSION} failed ({exc})"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return f"installing litellm[proxy]=={VERSION} failed: {last}"
    complete.touch()
    return program


def config(direct: str) -> str:
    """LiteLLM's config: one model ``bench`` forwarded to the stub as an OpenAI server."""
    return (
        "model_list:\n"
        "  - model_name: bench\n"
        "    litellm_params:\n"
        "      model: openai/bench\n"
        f"      api_base: {direct}/v1\n"
        "      api_key: none\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
        "  set_verbose: false\n"
    )


def command(program: Path, config_path: Path, port: int) -> list[str]:
    where = ["--host", "127.0.0.1", "--port", str(port)]
    return [str(program), "--config", str(config_path), *where, "--num_workers", "1"]


def environment() -> dict[str, str]:
    return {
        "LITELLM_MASTER_KEY": KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else ~7 s fetching a cost map at start
        "LITELLM_LOG": "ERROR",
        "PYTHONPATH": "",
    }
