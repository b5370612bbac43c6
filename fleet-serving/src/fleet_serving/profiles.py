"""Engine profiles: what each inference engine accepts, needs, and how it is started.

vLLM serves safetensors and needs a GPU of compute capability 7.5 or better; llama.cpp's
``llama-server`` serves GGUF and runs anywhere. A spec that pairs an engine with the other's weight
format is refused here, with the reason the FleetModel's status shows. Pure functions only.
"""

from __future__ import annotations

import msgspec

from fleet_contract import Engine, WeightFormat
from fleet_serving import adapters, arguments, devices, sources
from fleet_serving.errors import InvalidSpec
from fleet_serving.sources import RegistryWeights
from fleet_serving.spec import FleetModelSpec

__all__ = [
    "LLAMACPP",
    "PROFILES",
    "VLLM",
    "EngineProfile",
    "check",
    "engine_args",
    "image_for",
    "n_predict_cap",
    "profile_for",
]

MODEL_DIR = "/models"
"""Where an ``s3://`` or ``registry:`` source is copied before the engine starts."""


LLAMACPP_CONTEXT = 4096
"""llama-server's own default ``--ctx-size``: the server-side cap on generated tokens when the
FleetModel's engine arguments set no context size of their own (`n_predict_cap`)."""
_CTX_FLAGS = ("-c", "--ctx-size")
_PREDICT_FLAGS = ("-n", "--n-predict", "--predict")

LLAMACPP_BUILD = devices.LLAMACPP_BUILD
"""The llama.cpp release whose ``server`` images are run: pinned, never a floating tag."""


class EngineProfile(msgspec.Struct, kw_only=True, frozen=True):
    """One engine's facts; the renderer reads nothing else about engines."""

    engine: Engine
    weight_format: WeightFormat
    image: str
    """The image without accelerators; with them, the device profile's (:mod:`devices`)."""
    metrics_open: bool = True
    """Whether ``/metrics`` answers without the API key (vLLM's does; llama-server's does not,
    so Prometheus annotations would only collect 401s)."""
    port: int
    api_key_env: str
    """The variable the engine reads its API key from (never a flag: argv is world-readable)."""
    min_compute: tuple[int, int] | None
    health_path: str = "/health"
    min_gpus: int = 0
    cpu_request: str
    """The engine container's CPU request when the FleetModel sets no CPU of its own: a floor
    for the scheduler, never a limit, so the pod is Burstable rather than BestEffort."""
    memory_request: str
    """The same for memory (no limit either: an engine's peak while loading is not known here)."""


VLLM = EngineProfile(
    engine="vllm",
    weight_format="safetensors",
    image="vllm/vllm-openai:v0.11.0",
    port=8000,
    api_key_env="VLLM_API_KEY",
    min_compute=(7, 5),
    min_gpus=1,
    # Two busy processes (API server, engine core), each with torch and a CUDA context: a few GiB
    # of host memory before any weights. A GPU node has far more; the floor never blocks one.
    cpu_request="2",
    memory_request="8Gi",
)
LLAMACPP = EngineProfile(
    engine="llamacpp",
    weight_format="gguf",
    image=f"ghcr.io/ggml-org/llama.cpp:server-{LLAMACPP_BUILD}",
    port=8080,
    api_key_env="LLAMA_API_KEY",
    min_compute=None,
    metrics_open=False,
    # Often on small CPU nodes: half a core keeps two replicas of a small model on two cores, and
    # 1Gi holds the smallest GGUF models with their KV cache. Larger models set their own.
    cpu_request="500m",
    memory_request="1Gi",
)
PROFILES: dict[str, EngineProfile] = {p.engine: p for p in (VLLM, LLAMACPP)}


def profile_for(engine: Engine) -> EngineProfile:
    """The profile of an engine (the spec type admits only known engines)."""
    return PROFILES[engine]


def check(spec: FleetModelSpec) -> EngineProfile:
    """The spec's profile, or :class:`InvalidSpec` saying why this engine cannot serve it."""
    profile = profile_for(spec.engine)
    if spec.weight_format != profile.weight_format:
        raise InvalidSpec(
            f"{profile.engine} serves {profile.weight_format}; this model is {spec.weight_format}"
        )
    if spec.gpus_per_replica < profile.min_gpus:
        raise InvalidSpec(f"{profile.engine} needs at least {profile.min_gpus} GPU per replica")
    arguments.refuse_owned(spec.engine, spec.engine_args, gpus=spec.gpus_per_replica)
    devices.check(spec, profile.engine)
    adapters.check(spec)
    return profile


def image_for(spec: FleetModelSpec, profile: EngineProfile) -> str:
    """The spec's own image, else the accelerator's build of the engine when it asks for
    devices, else the profile's."""
    if spec.image:
        return spec.image
    if spec.gpus_per_replica > 0:
        return devices.device_profile(spec).images.get(profile.engine, profile.image)
    return profile.image


def _model_args(
    spec: FleetModelSpec, profile: EngineProfile, registry: RegistryWeights | None
) -> list[str]:
    """Where the engine loads from: the Hugging Face hub itself, or the folder filled before it
    starts (a ``registry:`` source needs ``registry``, the resolved model)."""
    hf = spec.source.hugging_face
    if profile.engine == "vllm":  # `vllm serve MODEL`: its --model flag is deprecated
        if hf is not None:
            return [hf.repo, "--revision", hf.revision]
        return [MODEL_DIR]
    if hf is not None:
        chosen = ["--hf-file", spec.weight_file] if spec.weight_file else []
        return ["--hf-repo", hf.repo, *chosen]
    if spec.source.uri is not None:
        return ["--model", f"{MODEL_DIR}/model.gguf"]
    # Invariants: rendering.deployment refuses an unresolved registry: source, and sources.check
    # refuses a GGUF model without a .gguf file.
    assert registry is not None
    return ["--model", f"{MODEL_DIR}/{sources.gguf_file(registry.weights, registry.weight_file)}"]


def engine_args(
    spec: FleetModelSpec, profile: EngineProfile, registry: RegistryWeights | None = None
) -> list[str]:
    """The engine's arguments: model, name, port, parallelism, then the user's own."""
    args = _model_args(spec, profile, registry)
    if profile.engine == "vllm":
        args += ["--served-model-name", spec.served_model_name]
        args += ["--host", "0.0.0.0", "--port", str(profile.port)]
        if spec.gpus_per_replica > 1:
            args += ["--tensor-parallel-size", str(spec.gpus_per_replica)]
    else:
        args += ["--alias", spec.served_model_name, "--metrics"]
        args += ["--host", "0.0.0.0", "--port", str(profile.port)]
        if spec.gpus_per_replica > 0:
            args += ["--n-gpu-layers", "999"]
        if (cap := n_predict_cap(spec.engine_args)) is not None:
            args += ["--n-predict", str(cap)]
    return args + list(spec.engine_args)


def n_predict_cap(user_args: list[str]) -> int | None:
    """llama-server's server-side cap on the tokens one request may generate (``--n-predict``),
    which no request's own ``n_predict`` can raise: the context size the FleetModel's engine
    arguments give (``-c``/``--ctx-size``), else `LLAMACPP_CONTEXT`. None when the arguments set
    ``--n-predict`` themselves (theirs stands). Without it llama-server generates until the
    context is full, whatever was reserved for the request: the gateway forwards one length
    (``max_tokens``), and this is the engine's own backstop behind it."""
    if _flag_value(user_args, _PREDICT_FLAGS) is not None:
        return None
    context = _flag_value(user_args, _CTX_FLAGS)
    try:
        size = int(context) if context is not None else LLAMACPP_CONTEXT
    except ValueError:
        size = LLAMACPP_CONTEXT  # llama-server itself refuses a malformed size at start
    return size if size > 0 else LLAMACPP_CONTEXT  # 0: the model's own, unknown here


def _flag_value(args: list[str], flags: tuple[str, ...]) -> str | None:
    """The last value given to any of ``flags`` (``-c 8192`` or ``--ctx-size=8192``), or None."""
    found = None
    for index, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        if name in flags:
            if equals:
                found = value
            elif index + 1 < len(args):
                found = args[index + 1]
    return found
