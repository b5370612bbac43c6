"""``engineArgs`` may not set what the operator owns, in any spelling the engine accepts; and every
flag the operator renders is owned, so a newly rendered flag cannot be overridden unnoticed."""

from __future__ import annotations

from typing import Any

import pytest

from fleet_serving import arguments, profiles, rendering, statuses
from fleet_serving.errors import InvalidSpec
from fleet_serving.spec import FleetModelStatus
from fleet_serving.view import ClusterView

from .test_rendering import OWNER, REGISTRY, spec

GGUF: dict[str, Any] = {"engine": "llamacpp", "weightFormat": "gguf", "gpusPerReplica": 0}


@pytest.mark.parametrize(
    ("args", "index", "named"),
    [
        (["--port", "9000"], 0, "'--port'"),
        (["--max-model-len=8192", "--port=9000"], 1, "'--port'"),
        (["--api-key", "x"], 0, "'--api-key'"),
        (["--api-k", "x"], 0, "'--api-k' (as --api-key)"),
        (["--api_key=x"], 0, "'--api-key'"),
        (["--host=::"], 0, "'--host'"),
        (["--served-model-name", "other"], 0, "'--served-model-name'"),
        (["--served", "other"], 0, "'--served' (as --served-model-name)"),
        (["--model", "/elsewhere"], 0, "'--model'"),
        (["--tensor-parallel-size", "4"], 0, "'--tensor-parallel-size'"),
        (["-tp", "4"], 0, "'-tp'"),
        (["-tp4"], 0, "'-tp4' (as -tp)"),
        (["--download-dir", "/tmp/x"], 0, "'--download-dir'"),
        (["--revision", "other"], 0, "'--revision'"),
        (["--config", "/etc/vllm.yaml"], 0, "'--config'"),
        (["--chat-template", "--port"], 1, "'--port'"),  # a value argparse reads as a flag
    ],
)
def test_vllm_refuses_what_the_operator_owns(args: list[str], index: int, named: str) -> None:
    with pytest.raises(InvalidSpec) as refused:
        profiles.check(spec(engineArgs=args))
    assert str(refused.value).startswith(f"spec.engineArgs[{index}] {named} is set by the operator")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--port", "9000"], "'--port'"),
        (["--api-key", "x"], "'--api-key'"),
        (["--api-key-file=/k"], "'--api-key-file'"),
        (["-m", "/other.gguf"], "'-m'"),
        (["--model=/other.gguf"], "'--model'"),
        (["-hf", "org/repo"], "'-hf'"),
        (["--hf-token", "hf_x"], "'--hf-token'"),
        (["-a", "other"], "'-a'"),
        (["--alias", "other"], "'--alias'"),
        (["--host", "0.0.0.0"], "'--host'"),
        (["--ssl-key-file", "k.pem"], "'--ssl-key-file'"),
    ],
)
def test_llamacpp_refuses_what_the_operator_owns(args: list[str], named: str) -> None:
    with pytest.raises(InvalidSpec, match=rf"^spec\.engineArgs\[0\] {named} is set by"):
        profiles.check(spec(engineArgs=args, **GGUF))


def test_gpu_layers_are_owned_only_when_the_operator_sets_them() -> None:
    profiles.check(spec(engineArgs=["-ngl", "20"], **GGUF))  # no GPU: nothing rendered
    with pytest.raises(InvalidSpec, match=r"'-ngl' is set by the operator: .*gpusPerReplica"):
        profiles.check(spec(engineArgs=["-ngl", "20"], **GGUF | {"gpusPerReplica": 1}))


@pytest.mark.parametrize(
    ("engine", "args"),
    [
        ("vllm", ["--max-model-len=8192", "--model-impl", "vllm", "--max-num-seqs", "8"]),
        ("vllm", ["--seed", "-1", "--api-server-count", "2", "--enable-lora"]),
        ("llamacpp", ["-c", "8192", "--n-predict", "256", "-np", "2", "-mg", "0"]),
        ("llamacpp", ["--api", "-hfd", "org/draft"]),  # prefixes are vLLM's, not llama.cpp's
    ],
)
def test_the_users_own_flags_pass(engine: str, args: list[str]) -> None:
    fields = GGUF if engine == "llamacpp" else {}
    profiles.check(spec(engineArgs=args, **fields))


def _rendered_flags(fields: dict[str, Any], registry: Any = None) -> set[str]:
    s = spec(**fields)
    args = rendering.deployment(OWNER, s, profiles.check(s), registry)["spec"]["template"]
    engine = args["spec"]["containers"][0]["args"]
    return {arg.split("=", 1)[0] for arg in engine if arg.startswith("-")}


@pytest.mark.parametrize(
    "fields",
    [
        {"gpusPerReplica": 4},
        {"source": {"uri": "s3://models/qwen"}, "gpusPerReplica": 1},
        GGUF | {"weightFile": "q4.gguf"},
        GGUF | {"source": {"uri": "s3://models/m.gguf"}, "gpusPerReplica": 2},
        GGUF | {"source": {"registry": "gemma"}},
    ],
)
def test_every_flag_the_operator_renders_is_owned(fields: dict[str, Any]) -> None:
    registry = REGISTRY if "registry" in fields.get("source", {}) else None
    s = spec(**fields)
    rendered = _rendered_flags(fields, registry)
    assert rendered, "nothing rendered: the test would pass vacuously"
    owned = set(arguments.owned(s.engine, gpus=s.gpus_per_replica))
    assert rendered - owned - arguments.OVERRIDABLE[s.engine] == set()


def test_a_refused_argument_fails_the_model_with_the_reason() -> None:
    view = ClusterView()
    body = {
        "metadata": {"name": "qwen", "namespace": "models", "generation": 2},
        "spec": {"servedModelName": "qwen", "engine": "vllm", "weightFormat": "safetensors",
                 "source": {"huggingFace": {"repo": "Qwen/Qwen3-8B"}},
                 "engineArgs": ["--max-num-seqs=8", "--port", "9000"]},
    }  # fmt: skip
    view.put_model(body, deleted=False)
    seen = view.observe(("models", "qwen"))
    assert seen is not None
    status = statuses.decide(seen, previous=FleetModelStatus(), now="2026-12-07T20:00:00Z")
    assert (status.phase, status.reason) == ("Failed", "InvalidSpec")
    assert status.message.startswith("spec.engineArgs[1] '--port' is set by the operator: ")
    assert "probes" in status.message


def test_image_and_engine_args_change_nothing_but_the_engines_image_and_argv() -> None:
    """What a FleetModel can put in ``image`` and ``engineArgs`` cannot reach the pod's security
    context, volumes, host namespaces or ServiceAccount (test_pod_escapes_e2e.py: on a real API
    server, with the fields a spec might try to smuggle in)."""
    hostile = ["--privileged", "--volume=/:/host", "--user=0", "--network=host", "--cap-add=ALL"]
    plain, tried = spec(), spec(image="ghcr.io/evil/root:1", engineArgs=hostile)
    before = rendering.deployment(OWNER, plain, profiles.check(plain))
    after = rendering.deployment(OWNER, tried, profiles.check(tried))
    engine = after["spec"]["template"]["spec"]["containers"][0]
    assert engine["image"] == "ghcr.io/evil/root:1"
    assert engine["args"][-len(hostile) :] == hostile
    engine |= {"image": profiles.VLLM.image, "args": engine["args"][: -len(hostile)]}
    assert after == before
