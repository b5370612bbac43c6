"""Container probes, executed by the stand-in against the process on the pod's address.

``httpGet`` (a named or numbered port; 200–399 passes), ``tcpSocket`` and ``exec`` (run with
the container's environment). Probes run at the rendered period but at least every second
(``MAX_PERIOD_S``): the operator renders 5–15 s periods for engines that load for minutes, which
would only make a test wait; thresholds are kept as rendered.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .containers import Launch

__all__ = ["MAX_PERIOD_S", "ProbeState", "run_probe"]

MAX_PERIOD_S = 1.0
TIMEOUT_S = 2.0

Obj = Mapping[str, Any]


def _port(container: Obj, port: object) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(str(port))
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"container {container['name']} declares no port named {port!r}")


def run_probe(probe: Obj, container: Obj, ip: str, launch: Launch) -> bool:
    """One probe attempt: did it pass?"""
    timeout = min(float(probe.get("timeoutSeconds", 1)), TIMEOUT_S)
    if "httpGet" in probe:
        get = probe["httpGet"]
        url = (
            f"http://{get.get('host') or ip}:{_port(container, get['port'])}{get.get('path', '/')}"
        )
        try:
            with urllib.request.urlopen(url, timeout=timeout) as answer:
                return bool(200 <= answer.status < 400)
        except urllib.error.HTTPError as exc:
            exc.close()
            return 200 <= exc.code < 400
        except OSError:
            return False
    if "tcpSocket" in probe:
        try:
            with socket.create_connection(
                (ip, _port(container, probe["tcpSocket"]["port"])), timeout
            ):
                return True
        except OSError:
            return False
    if "exec" in probe:
        command = probe["exec"]["command"]
        done = subprocess.run(command, env=launch.env, cwd=launch.cwd, timeout=timeout,
                              capture_output=True, check=False)  # fmt: skip
        return done.returncode == 0
    raise ValueError(f"unsupported probe {sorted(probe)}")


@dataclass
class ProbeState:
    """One probe's running tally, reset when its container restarts."""

    probe: Obj | None
    passed: bool = False
    failures: int = 0
    successes: int = 0
    last: float = field(default=0.0)

    def due(self, now: float) -> bool:
        if self.probe is None:
            return False
        period = min(float(self.probe.get("periodSeconds", 10)), MAX_PERIOD_S)
        return now - self.last >= period

    def record(self, ok: bool, now: float) -> None:
        """Flip ``passed`` after the probe's success or failure threshold in a row."""
        assert self.probe is not None
        self.last = now
        if ok:
            self.failures, self.successes = 0, self.successes + 1
            if self.successes >= int(self.probe.get("successThreshold", 1)):
                self.passed = True
        else:
            self.successes, self.failures = 0, self.failures + 1
            if self.failures >= int(self.probe.get("failureThreshold", 3)):
                self.passed = False

    @property
    def failed_out(self) -> bool:
        """Failed its threshold (a liveness or startup probe: the container is killed)."""
        return self.probe is not None and self.failures >= int(
            self.probe.get("failureThreshold", 3)
        )


def now() -> float:
    return time.monotonic()
