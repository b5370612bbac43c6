"""LoRA adapters of a FleetModel: the flags each engine gets, the files fetched, the refusals."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_contract import ModelWeights, WeightFile
from fleet_serving import adapters, profiles, rendering
from fleet_serving.adapters import ResolvedAdapter
from fleet_serving.errors import InvalidSpec
from fleet_serving.sources import RegistryWeights
from fleet_serving.spec import MAX_ADAPTERS, decode_spec
from fleet_serving.view import ClusterView

OWNER = rendering.Owner(name="gemma", namespace="models", uid="uid-1")
CP = "http://cp:8081"


def weights(model_id: str, *paths: str) -> RegistryWeights:
    files = tuple(WeightFile(path=p, size=4, sha256=f"{i:x}" * 64) for i, p in enumerate(paths))
    return RegistryWeights(
        control_plane=CP, weights=ModelWeights(model_id=model_id, status="Ready", files=files)
    )


BASE = weights("gemma", "gemma.gguf")


def spec(engine: str = "llamacpp", names: tuple[str, ...] = ("pirate", "poet"), **more: Any) -> Any:
    gguf = engine == "llamacpp"
    body: dict[str, Any] = {
        "servedModelName": "gemma",
        "source": {"registry": "gemma"},
        "weightFormat": "gguf" if gguf else "safetensors",
        "engine": engine,
        "gpusPerReplica": 0 if gguf else 1,
        "engineArgs": ["--threads", "1"],
        "adapters": [{"name": n, "source": {"registry": f"lora-{n}"}} for n in names],
    }
    return decode_spec(body | more)


def resolved(s: Any) -> list[ResolvedAdapter]:
    files = ("adapter.gguf",) if s.engine == "llamacpp" else ("adapter_config.json", "a.bin")
    return [
        ResolvedAdapter(name=a.name, index=i, registry=weights(a.source.registry, *files))
        for i, a in enumerate(s.adapters)
    ]


def pod_of(s: Any) -> dict[str, Any]:
    d = rendering.deployment(OWNER, s, profiles.check(s), BASE, resolved(s))
    return dict(d["spec"]["template"]["spec"])


def test_llama_server_loads_every_adapter_unapplied_in_spec_order_before_the_users_args() -> None:
    args = pod_of(spec())["containers"][0]["args"]
    flags = [
        "--lora", "/models/adapters/0/adapter.gguf",
        "--lora", "/models/adapters/1/adapter.gguf",
        "--lora-init-without-apply",
    ]  # fmt: skip
    assert args[-len(flags) - 2 :] == [*flags, "--threads", "1"]
    assert args[:2] == ["--model", "/models/gemma.gguf"]


def test_vllm_serves_each_adapter_under_its_own_name() -> None:
    args = pod_of(spec("vllm", source={"registry": "gemma"}))["containers"][0]["args"]
    i = args.index("--enable-lora")
    assert args[i : i + 6] == [
        "--enable-lora", "--max-loras", "2", "--lora-modules",
        "pirate=/models/adapters/0", "poet=/models/adapters/1",
    ]  # fmt: skip
    assert "--max-lora-rank" not in args  # vLLM's default (16) holds them
    assert args[-2:] == ["--threads", "1"]


@pytest.mark.parametrize(
    ("ranks", "flag"), [((8, 16), None), ((17,), "32"), ((8, 64), "64"), ((300,), "320")]
)
def test_vllm_max_lora_rank_is_the_smallest_it_accepts_above_every_adapter(
    ranks: tuple[int, ...], flag: str | None
) -> None:
    listed = [
        {"name": f"a{i}", "source": {"registry": f"r{i}"}, "rank": r} for i, r in enumerate(ranks)
    ]
    args = pod_of(spec("vllm", adapters=listed))["containers"][0]["args"]
    found = args[args.index("--max-lora-rank") + 1] if "--max-lora-rank" in args else None
    assert found == flag


def test_the_adapters_are_fetched_and_checked_by_their_own_init_container() -> None:
    pod = pod_of(spec())
    fetch, adapter_fetch = pod["initContainers"]
    assert fetch["name"] == "fetch-weights"
    assert adapter_fetch["name"] == "fetch-adapters"
    assert adapter_fetch["command"] == fetch["command"]  # the same checked, resumable script
    assert adapter_fetch["args"] == [
        "adapters/0/adapter.gguf", f"{CP}/api/v1/models/lora-pirate/files/adapter.gguf", "0" * 64,
        "adapters/1/adapter.gguf", f"{CP}/api/v1/models/lora-poet/files/adapter.gguf", "0" * 64,
    ]  # fmt: skip
    assert adapter_fetch["env"] == fetch["env"]  # the engine credential, from its Secret
    assert adapter_fetch["securityContext"] == fetch["securityContext"]


def test_a_model_without_adapters_renders_as_before() -> None:
    pod = pod_of(spec(names=()))
    assert [c["name"] for c in pod["initContainers"]] == ["fetch-weights"]
    assert not any("lora" in a for a in pod["containers"][0]["args"])


def test_adapters_are_rendered_only_once_resolved() -> None:
    s = spec()
    with pytest.raises(ValueError, match="resolved"):
        rendering.deployment(OWNER, s, profiles.check(s), BASE)


@pytest.mark.parametrize(
    ("listed", "why"),
    [
        (["gemma"], "servedModelName"),
        (["pirate", "pirate"], "listed twice"),
        ([f"a{i}" for i in range(MAX_ADAPTERS + 1)], f"length <= {MAX_ADAPTERS}"),
        (["bad name"], "spec.adapters"),
        (["=x"], "spec.adapters"),
        (["a,b"], "spec.adapters"),
        ([""], "spec.adapters"),
        (["x" * 254], "spec.adapters"),
    ],
)
def test_adapters_that_cannot_be_served_are_refused_with_the_reason(
    listed: list[str], why: str
) -> None:
    with pytest.raises(InvalidSpec, match=why):
        profiles.check(spec(names=tuple(listed)))


@pytest.mark.parametrize(
    ("engine", "paths", "why"),
    [
        ("llamacpp", ("a.gguf", "b.gguf"), "holds 2 .gguf files"),
        ("llamacpp", ("README.md",), "holds 0 .gguf files"),
        ("llamacpp", ("x,y.gguf",), "splits --lora"),
        ("llamacpp", ("../a.gguf",), "outside its folder"),
        ("vllm", ("adapter_model.safetensors",), "adapter_config.json"),
    ],
)
def test_registry_models_that_are_not_an_adapter_for_the_engine_are_refused(
    engine: str, paths: tuple[str, ...], why: str
) -> None:
    with pytest.raises(InvalidSpec, match=why):
        adapters.check_weights(engine, "pirate", weights("lora", *paths).weights)  # type: ignore[arg-type]


def test_the_inventory_report_lists_the_adapters_in_spec_order() -> None:
    view = ClusterView()
    body = {
        "metadata": {"name": "gemma", "namespace": "models", "generation": 1},
        "spec": {
            "servedModelName": "gemma", "source": {"registry": "gemma"}, "weightFormat": "gguf",
            "engine": "llamacpp", "gpusPerReplica": 0,
            "adapters": [{"name": "poet", "source": {"registry": "p"}},
                         {"name": "pirate", "source": {"registry": "q"}}],
        },
    }  # fmt: skip
    view.put_model(body, deleted=False)
    (deployment,) = view.report(cluster_id="c", now=datetime.now(UTC)).deployments
    assert deployment.adapters == ("poet", "pirate")


NAMES = st.from_regex(r"[a-z][a-z0-9\-]{0,12}", fullmatch=True)


@given(st.lists(NAMES, max_size=MAX_ADAPTERS, unique=True))
def test_llama_server_ids_follow_the_spec_order(names: list[str]) -> None:
    """The gateway selects adapter ``i`` of the report by llama-server's id ``i``: the i-th
    ``--lora`` flag must be the i-th adapter's file, whatever the names."""
    s = spec(names=tuple(n for n in names if n != "gemma"))
    args = pod_of(s)["containers"][0]["args"]
    loaded = [args[i + 1] for i, a in enumerate(args) if a == "--lora"]
    assert loaded == [f"/models/adapters/{i}/adapter.gguf" for i in range(len(s.adapters))]
    assert ("--lora-init-without-apply" in args) == bool(s.adapters)
