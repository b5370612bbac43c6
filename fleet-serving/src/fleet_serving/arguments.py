"""Engine arguments the operator owns, which a FleetModel's ``engineArgs`` may not set.

The operator renders the engine's address (``--host``/``--port``: the probes, the Service and the
gateway use them), the model it loads and the name it serves it under, its parallelism from
``gpusPerReplica``, and its API key (from a Secret, in the environment: never in argv). An
``engineArgs`` entry setting one of them would break the pod (probes on the wrong port), the
routing (another served name) or leak a secret into argv, so it is refused with the reason the
FleetModel's status shows, in every spelling the engine would accept: ``--flag value``,
``--flag=value``, short forms (llama.cpp's ``-m``), ``_`` for ``-`` (both engines' parsers
normalise it), and, for vLLM, argparse's unique-prefix abbreviations (``--api-k``). Pure
functions only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fleet_contract import Engine
from fleet_serving.errors import InvalidSpec

__all__ = ["OVERRIDABLE", "owned", "refuse_owned"]

_ADDRESS = "the operator sets the engine's address (probes, Service and gateway use it)"
_KEY = "the engine's API key comes from spec.apiKeySecret, in the environment, never argv"
_MODEL = "the operator points the engine at spec.source"
_NAME = "the engine serves spec.servedModelName, the name the gateway routes"
_GPUS = "the operator sets it from spec.gpusPerReplica"
_TLS = "the probes and the gateway speak plain HTTP to the pod"

VLLM_OWNED: Mapping[str, str] = {
    "--host": _ADDRESS,
    "--port": _ADDRESS,
    "--uds": _ADDRESS,
    "--api-key": _KEY,
    "--model": _MODEL,
    "--revision": _MODEL,
    "--download-dir": "hub downloads go to the pod's model volume (HF_HOME)",
    "--config": "a config file can set the operator's own flags; put its flags in engineArgs",
    "--served-model-name": _NAME,
    "--tensor-parallel-size": _GPUS,
    "-tp": _GPUS,
    "--ssl-keyfile": _TLS,
    "--ssl-certfile": _TLS,
}
"""vLLM's flags the operator owns, with why. vLLM's parser accepts any unique prefix of a long
flag, so a prefix of one of these is refused too."""

LLAMACPP_OWNED: Mapping[str, str] = {
    "--host": _ADDRESS,
    "--port": _ADDRESS,
    "--api-key": _KEY,
    "--api-key-file": _KEY,
    "-m": _MODEL,
    "--model": _MODEL,
    "-mu": _MODEL,
    "--model-url": _MODEL,
    "-hf": _MODEL,
    "-hfr": _MODEL,
    "--hf-repo": _MODEL,
    "-hff": _MODEL,
    "--hf-file": _MODEL,
    "-hft": "a gated model's token comes from spec.hfTokenSecret, never argv",
    "--hf-token": "a gated model's token comes from spec.hfTokenSecret, never argv",
    "-a": _NAME,
    "--alias": _NAME,
    "--metrics": "the operator turns the metrics endpoint on",
    "--ssl-key-file": _TLS,
    "--ssl-cert-file": _TLS,
}
"""llama-server's flags the operator owns, with why (its parser takes exact names only)."""

LLAMACPP_GPU_OWNED: Mapping[str, str] = {
    "-ngl": _GPUS,
    "--gpu-layers": _GPUS,
    "--n-gpu-layers": _GPUS,
}
"""Owned when the operator renders them: with ``gpusPerReplica`` above 0 (every layer on the
GPU); without GPUs there is nothing to offload to and they are the user's."""

OVERRIDABLE: Mapping[Engine, frozenset[str]] = {
    "vllm": frozenset(),
    "llamacpp": frozenset({"--n-predict"}),
}
"""Flags the operator renders only as a default the FleetModel's own value replaces: llama.cpp's
``--n-predict`` backstop is rendered only when ``engineArgs`` sets none
(:func:`fleet_serving.profiles.n_predict_cap`)."""


def owned(engine: Engine, *, gpus: int) -> Mapping[str, str]:
    """The flags the operator owns for this engine, each with why."""
    if engine == "vllm":
        return VLLM_OWNED
    return {**LLAMACPP_OWNED, **(LLAMACPP_GPU_OWNED if gpus > 0 else {})}


def _flag(arg: str) -> str | None:
    """The flag an argument names, as the engine's parser sees it: ``--Api_Key=x`` → ``--api-key``
    (case kept: flags are case-sensitive); None for a value."""
    if not arg.startswith("-") or arg == "-" or _is_number(arg):
        return None
    name = arg.split("=", 1)[0].split(None, 1)[0] if arg.strip() else arg
    dashes = len(name) - len(name.lstrip("-"))
    return name[:dashes] + name[dashes:].replace("_", "-")


def _is_number(arg: str) -> bool:
    try:
        float(arg)
    except ValueError:
        return False
    return True


def _match(flag: str, flags: Iterable[str], *, prefixes: bool) -> str | None:
    """The owned flag ``flag`` sets: itself or, for argparse (``prefixes``), the owned flag it
    abbreviates (``--api-k``, ``-t``) or a short one with its value attached (``-tp2``)."""
    names = list(flags)
    if flag in names:
        return flag
    if not prefixes or len(flag.strip("-")) == 0:
        return None
    for name in names:
        if name.startswith(flag) or (not name.startswith("--") and flag.startswith(name)):
            return name
    return None


def refuse_owned(engine: Engine, args: Iterable[str], *, gpus: int) -> None:
    """:class:`InvalidSpec` naming the first argument that sets a flag the operator owns."""
    flags = owned(engine, gpus=gpus)
    for index, arg in enumerate(args):
        flag = _flag(arg)
        if flag is None:
            continue
        hit = _match(flag, flags, prefixes=engine == "vllm")
        if hit is not None:
            spelled = "" if hit == flag else f" (as {hit})"
            raise InvalidSpec(
                f"spec.engineArgs[{index}] {flag!r}{spelled} is set by the operator: {flags[hit]}"
            )
