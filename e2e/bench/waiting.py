"""Waiting for a server the bench started: its URL answers, or the bench stops with why."""

from __future__ import annotations

import subprocess
import time
import urllib.request

__all__ = ["wait_for"]


def wait_for(url: str, proc: subprocess.Popen[bytes], within_s: float = 120) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bench: a server exited early ({proc.args!r})")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"bench: {url} never answered")
