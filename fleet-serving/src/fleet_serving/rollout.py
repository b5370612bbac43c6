"""How long an engine pod may take to start, and to stop: the figures every timing field of a
FleetModel's pods and Deployment is derived from, so they cannot disagree.

Starting: the startup probe gives a loading engine ``STARTUP_BUDGET_S`` (30 minutes: a 70B model
read from a network volume takes that long) before the kubelet restarts it. The Deployment's
``progressDeadlineSeconds`` must be longer still, by what comes before the probe counts (pulling a
multi-gigabyte engine image, the ``fetch-weights`` init container): the API server's default, 600
s, had a slow model's rollout marked ``ProgressDeadlineExceeded`` while it was still loading.

Stopping: a deleted engine pod leaves the EndpointSlice at once, but keeps serving, through its
``preStop`` sleep, for ``spec.drainSeconds``: the operator's report and every gateway's next poll
of the endpoints take up to `ROUTING_DELAY_S`, and streams in flight finish meanwhile. Only then is
the engine sent SIGTERM (llama-server drops open streams on it; vLLM drains them), and it gets
`STOP_S` more before SIGKILL. ``terminationGracePeriodSeconds`` counts the sleep too, so it is
their sum: a grace shorter than the sleep would have the kubelet kill a draining engine.

Pure figures and functions.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_DRAIN_S",
    "MAX_DRAIN_S",
    "PROGRESS_DEADLINE_S",
    "ROUTING_DELAY_S",
    "STARTUP_BUDGET_S",
    "STARTUP_FAILURES",
    "STARTUP_PERIOD_S",
    "STOP_S",
    "termination_grace",
]

STARTUP_PERIOD_S = 10
"""How often the startup probe asks a loading engine."""
STARTUP_FAILURES = 180
"""How many failed startup probes the kubelet tolerates before it restarts the engine."""
STARTUP_BUDGET_S = STARTUP_PERIOD_S * STARTUP_FAILURES
"""How long an engine may take to load its weights: 1,800 s."""
START_MARGIN_S = 900
"""What a new pod spends before its startup probe counts: scheduling, pulling an engine image
(vLLM's is about 10 GB), the ``fetch-weights`` init container copying weights."""
PROGRESS_DEADLINE_S = STARTUP_BUDGET_S + START_MARGIN_S
"""The Deployment's ``progressDeadlineSeconds``: 2,700 s, so ``ProgressDeadlineExceeded`` means
a rollout that cannot succeed, never a model still loading."""

ROUTING_DELAY_S = 10
"""How long after a pod's deletion a gateway may still route to it (the operator's report, then
every gateway's next poll): the shortest drain, since a shorter one refuses routed requests."""
DEFAULT_DRAIN_S = 30
"""``spec.drainSeconds`` unless given: a stream of about 1,000 tokens at 40 tokens a second."""
MAX_DRAIN_S = 3600
"""The longest drain a FleetModel may ask for: every deletion and rollout step waits this long."""
STOP_S = 15
"""After SIGTERM, how long an engine has to stop (free the GPU, flush logs) before SIGKILL."""


def termination_grace(drain_s: int) -> int:
    """The pod's ``terminationGracePeriodSeconds`` for a ``preStop`` sleep of ``drain_s``."""
    return drain_s + STOP_S
