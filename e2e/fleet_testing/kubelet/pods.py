"""One pod on the stand-in: its containers as processes, restarted, probed and reported.

A :class:`PodRunner` is advanced by the kubelet loop (:meth:`PodRunner.step`, a few times a
second): init containers run one after another, each to a zero exit, then the pod's containers
start; a process that exits is started again after a back-off (``restartPolicy: Always``;
1 s doubling to 10 s here, where a kubelet starts at 10 s and stops at 5 min) with its
``restartCount`` and ``lastState``; startup, readiness and liveness probes run against the
process (:mod:`.probes`). :meth:`PodRunner.status` is the pod's status as a kubelet writes it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import containers, probes
from .containers import ConfigError, Fetch, Launch, PodContext
from .images import Image
from .probes import ProbeState

__all__ = ["PodRunner"]

Obj = Mapping[str, Any]
MAX_BACKOFF_S = 10.0
STOP_GRACE_S = 5.0


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Container:
    spec: Obj
    init: bool
    process: subprocess.Popen[bytes] | None = None
    launch: Launch | None = None
    restarts: int = 0
    started_at: str = ""
    waiting: tuple[str, str] = ("ContainerCreating", "")
    last: dict[str, Any] | None = None
    """The last termination (``lastState.terminated``)."""
    done: dict[str, Any] | None = None
    """An init container's successful exit."""
    retry_at: float = 0.0
    startup: ProbeState = field(init=False)
    readiness: ProbeState = field(init=False)
    liveness: ProbeState = field(init=False)

    def __post_init__(self) -> None:
        self.reset_probes()

    def reset_probes(self) -> None:
        self.startup = ProbeState(self.spec.get("startupProbe"))
        self.readiness = ProbeState(self.spec.get("readinessProbe"))
        self.liveness = ProbeState(self.spec.get("livenessProbe"))

    @property
    def started(self) -> bool:
        return self.process is not None and (self.startup.probe is None or self.startup.passed)

    @property
    def ready(self) -> bool:
        if self.init:
            return self.done is not None
        return self.started and (self.readiness.probe is None or self.readiness.passed)


class PodRunner:
    """The processes of one pod bound to one of the stand-in's nodes."""

    def __init__(self, pod: Obj, *, context: PodContext, images: Mapping[str, Image],
                 fetch: Fetch) -> None:  # fmt: skip
        self.uid = str(pod["metadata"]["uid"])
        self.context = context
        self.images = images
        self.fetch = fetch
        self.pod = pod
        self.started_at = _stamp()
        self.inits = [Container(c, True) for c in pod["spec"].get("initContainers") or []]
        self.mains = [Container(c, False) for c in pod["spec"]["containers"]]
        self.dirs: dict[str, Path] | None = None
        self.transitions: dict[str, tuple[bool, str]] = {}
        self.reported: dict[str, Any] | None = None
        """The status last written to the API (written again only when it changes)."""
        (context.root / "logs").mkdir(parents=True, exist_ok=True)

    # -- advancing ---------------------------------------------------------------------------

    def step(self) -> None:
        if self.dirs is None:
            try:
                self.dirs = containers.volume_dirs(self.pod, self.context.root, self.fetch,
                                                   self.context)  # fmt: skip
            except ConfigError as exc:
                for c in [*self.inits, *self.mains]:
                    c.waiting = ("CreateContainerConfigError", str(exc))
                return
        for c in self.inits:
            if c.done is None:
                self._advance(c)
                if c.done is None:
                    for main in self.mains:
                        main.waiting = ("PodInitializing", "")
                    return
        for c in self.mains:
            self._advance(c)
            if c.process is not None:
                self._probe(c)

    def _advance(self, c: Container) -> None:
        if c.process is None:
            if time.monotonic() >= c.retry_at:
                self._start(c)
            return
        code = c.process.poll()
        if code is None:
            return
        if c.init and code == 0:
            c.done = self._terminated(c, code, "Completed")
            c.process = None
            return
        c.last = self._terminated(c, code, "Error")  # a signal too: exit code 128 + signal
        self._crashed(c)

    def _crashed(self, c: Container) -> None:
        c.process, c.restarts = None, c.restarts + 1
        c.retry_at = time.monotonic() + min(2.0 ** (c.restarts - 1), MAX_BACKOFF_S)
        c.waiting = ("CrashLoopBackOff", f"back-off restarting failed container {c.spec['name']}")
        c.reset_probes()

    def _terminated(self, c: Container, code: int, reason: str) -> dict[str, Any]:
        return {"exitCode": code if code >= 0 else 128 - code, "reason": reason,
                "startedAt": c.started_at, "finishedAt": _stamp(),
                "containerID": self._container_id(c)}  # fmt: skip

    def _start(self, c: Container) -> None:
        image = self.images.get(c.spec["image"])
        if image is None:
            c.waiting = ("ImagePullBackOff", f'Back-off pulling image "{c.spec["image"]}": not '
                         "in the kubelet stand-in's image table")  # fmt: skip
            c.retry_at = time.monotonic() + 1.0
            return
        try:
            assert self.dirs is not None
            c.launch = containers.launch(c.spec, image, self.dirs, self.fetch, self.context)
        except ConfigError as exc:
            c.waiting = ("CreateContainerConfigError", str(exc))
            c.retry_at = time.monotonic() + 1.0
            return
        log = self.context.root / "logs" / f"{c.spec['name']}.log"
        try:
            with log.open("ab") as out:
                c.process = subprocess.Popen(
                    c.launch.argv, env=c.launch.env, cwd=c.launch.cwd, stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
        except OSError as exc:
            c.last = {"exitCode": 128, "reason": "StartError", "message": str(exc),
                      "startedAt": _stamp(), "finishedAt": _stamp()}  # fmt: skip
            self._crashed(c)
            return
        c.started_at = _stamp()

    def _probe(self, c: Container) -> None:
        assert c.launch is not None
        now = time.monotonic()
        check = c.startup if not c.started else c.readiness
        for state in (check, c.liveness) if c.started else (check,):
            if state.due(now):
                state.record(probes.run_probe(state.probe or {}, c.spec, self.context.ip,
                                              c.launch), now)  # fmt: skip
                if state is not c.readiness and state.failed_out:
                    self._kill(c)  # a failed startup or liveness probe: restart it
                    return

    # -- stopping ----------------------------------------------------------------------------

    def _kill(self, c: Container, *, grace: float = STOP_GRACE_S) -> None:
        process = c.process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def stop(self) -> None:
        """Stop every process of the pod (SIGTERM to its process group, SIGKILL after 5 s)."""
        for c in [*self.inits, *self.mains]:
            self._kill(c)
            c.process = None

    def process(self, name: str) -> subprocess.Popen[bytes] | None:
        """The running process of container ``name`` (for a test to kill it)."""
        for c in [*self.inits, *self.mains]:
            if c.spec["name"] == name:
                return c.process
        raise KeyError(name)

    # -- reporting ---------------------------------------------------------------------------

    def _container_id(self, c: Container) -> str:
        return f"process://{c.process.pid}" if c.process is not None else ""

    def _container_status(self, c: Container) -> dict[str, Any]:
        if c.done is not None:
            state: dict[str, Any] = {"terminated": c.done}
        elif c.process is not None:
            state = {"running": {"startedAt": c.started_at}}
        else:
            reason, message = c.waiting
            state = {"waiting": {"reason": reason} | ({"message": message} if message else {})}
        status = {
            "name": c.spec["name"], "image": c.spec["image"], "imageID": "",
            "ready": c.ready, "restartCount": c.restarts, "state": state,
            "lastState": {"terminated": c.last} if c.last else {},
        }  # fmt: skip
        if not c.init:
            status["started"] = c.started
        if c.process is not None:
            status["containerID"] = self._container_id(c)
        return status

    def _condition(self, kind: str, flag: bool) -> dict[str, str]:
        """A condition whose lastTransitionTime moves only when it flips."""
        before = self.transitions.get(kind)
        if before is None or before[0] != flag:
            self.transitions[kind] = before = (flag, _stamp())
        return {"type": kind, "status": str(flag), "lastTransitionTime": before[1]}

    def status(self) -> dict[str, Any]:
        initialized = all(c.done is not None for c in self.inits)
        ready = initialized and all(c.ready for c in self.mains)
        running = initialized and any(c.process is not None or c.restarts for c in self.mains)
        flags = {"PodScheduled": True, "Initialized": initialized,
                 "ContainersReady": ready, "Ready": ready}  # fmt: skip
        return {
            "phase": "Running" if running else "Pending",
            "hostIP": self.context.ip.rsplit(".", 1)[0] + ".1",
            "podIP": self.context.ip,
            "podIPs": [{"ip": self.context.ip}],
            "startTime": self.started_at,
            "conditions": [self._condition(kind, flag) for kind, flag in flags.items()],
            "initContainerStatuses": [self._container_status(c) for c in self.inits],
            "containerStatuses": [self._container_status(c) for c in self.mains],
        }
