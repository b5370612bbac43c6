"""The node's daemons as processes inside its network namespace (``nsenter --net``, which
``exec``s, so each PID is the daemon's own), each logging to ``<root>/<name>.log``, each stopped
by its PID: SIGTERM, then SIGKILL after a grace."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fleet_testing.node.tools import Tools

__all__ = ["Daemons"]

E2E = Path(__file__).resolve().parents[2]
"""The folder holding ``fleet_testing`` (the relay runs as ``python -m``)."""


@dataclass
class Daemons:
    tools: Tools
    netns: Path
    logs: Path
    started: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(
        self, name: str, argv: list[str], *, stdout: int | None = None
    ) -> subprocess.Popen[bytes]:
        env = {"PATH": self.tools.path, "HOME": str(Path.home()), "PYTHONPATH": str(E2E),
               "CONTAINERD_NO_SYSTEMD": "1"}  # fmt: skip
        with (self.logs / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                [self.tools["nsenter"], f"--net={self.netns}", "--", *argv],
                stdout=stdout if stdout is not None else log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self.started[name] = process
        return process

    def relay(self, listen: int, target: int, *, address: str = "127.0.0.1",
              name: str = "relay") -> None:  # fmt: skip
        """A host loopback port inside the namespace (:mod:`fleet_testing.node.relay`)."""
        argv = [sys.executable, "-m", "fleet_testing.node.relay", str(self.netns), str(listen),
                str(target), address]  # fmt: skip
        env = {"PATH": self.tools.path, "PYTHONPATH": str(E2E)}
        with (self.logs / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started[name] = process
        assert process.stdout is not None
        said = process.stdout.readline().strip()
        process.stdout.close()  # it says nothing more
        if said != b"ready":
            raise RuntimeError(f"the relay {name} did not start:\n{self.log_tail(name)}")

    def check(self) -> None:
        """Raise with its log if a daemon has exited."""
        for name, process in self.started.items():
            if process.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {process.returncode}:\n{self.log_tail(name)}"
                )

    def log_tail(self, name: str, size: int = 3000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-size:] if path.exists() else ""

    def stop(self, name: str, *, grace: float = 10.0) -> None:
        process = self.started.pop(name, None)
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop_all(self) -> None:
        for name in reversed(list(self.started)):
            with contextlib.suppress(OSError):
                self.stop(name)
