"""Where an engine pod keeps its weights, as rendered: a shared cache claim, or bounded emptyDirs.

The cache script itself runs for real in ``test_caching_script.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet_contract import ModelWeights, WeightFile
from fleet_serving import caching, profiles, rendering, sources
from fleet_serving.errors import InvalidSpec
from fleet_serving.sources import RegistryWeights
from fleet_serving.spec import decode_spec

OWNER = rendering.Owner(name="tiny", namespace="models", uid="uid-1")
GIB = 2**30
GGUF = {"servedModelName": "tiny", "weightFormat": "gguf", "engine": "llamacpp",
        "gpusPerReplica": 0}  # fmt: skip
QUANTS = {"Q4.gguf": 5 * GIB, "Q8-00001-of-00002.gguf": 5 * GIB,
          "Q8-00002-of-00002.gguf": 4 * GIB, "config.json": 1000}  # fmt: skip


def registry(files: dict[str, int] = QUANTS, weight_file: str | None = None) -> RegistryWeights:
    listed = tuple(WeightFile(path=p, size=n, sha256=f"{i:064x}")
                   for i, (p, n) in enumerate(sorted(files.items())))  # fmt: skip
    weights = ModelWeights(model_id="tiny", status="Ready", format="gguf", files=listed)
    return RegistryWeights(control_plane="http://cp/", weights=weights, weight_file=weight_file)


def pod(source: dict[str, Any], model_volume: dict[str, str] | None = None,
        resolved: RegistryWeights | None = None, **fields: Any) -> dict[str, Any]:  # fmt: skip
    s = decode_spec(GGUF | fields | {"source": source, "modelVolume": model_volume or {}})
    d = rendering.deployment(OWNER, s, profiles.check(s), resolved)
    return dict(d["spec"]["template"]["spec"])


def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


def storage(container: dict[str, Any]) -> str | None:
    found: str | None = container["resources"].get("requests", {}).get("ephemeral-storage")
    return found


def test_a_cached_registry_model_mounts_the_claim_and_links_into_it() -> None:
    p = pod({"registry": "tiny"}, {"cacheClaim": "model-cache"}, registry(weight_file="Q4.gguf"),
            weightFile="Q4.gguf")  # fmt: skip
    volumes = by_name(p["volumes"])
    assert volumes["model-cache"] == {
        "name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"},
    }  # fmt: skip
    assert volumes["models"] == {"name": "models", "emptyDir": {"sizeLimit": "16Mi"}}  # links
    (fetch,) = p["initContainers"]
    (engine,) = p["containers"]
    assert fetch["command"] == ["sh", "-c", caching.CACHE_SCRIPT, "fetch-weights"]
    env = by_name(fetch["env"])
    assert env["CACHE_DIR"]["value"] == "/model-cache"
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert by_name(fetch["volumeMounts"])["model-cache"] == {
        "name": "model-cache", "mountPath": "/model-cache",
    }  # fmt: skip
    mounts = by_name(engine["volumeMounts"])
    assert mounts["model-cache"] == {
        "name": "model-cache", "mountPath": "/model-cache", "readOnly": True,
    }  # fmt: skip
    assert mounts["models"] == {"name": "models", "mountPath": "/models", "readOnly": True}
    assert engine["args"][:2] == ["--model", "/models/Q4.gguf"]  # the link's path
    assert storage(fetch) == "16Mi"
    assert p["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"


def test_an_uncached_registry_model_is_bounded_by_its_served_files_plus_headroom() -> None:
    p = pod({"registry": "tiny"}, None, registry(weight_file="Q8-00001-of-00002.gguf"),
            weightFile="Q8-00001-of-00002.gguf")  # fmt: skip
    served = 9 * GIB + 1000  # both Q8 parts and config.json; not Q4
    expected = caching.quantity(served + served // 50 + 64 * 2**20)
    assert expected == "9465Mi"
    assert by_name(p["volumes"])["models"] == {"name": "models",
                                               "emptyDir": {"sizeLimit": expected}}  # fmt: skip
    (fetch,) = p["initContainers"]
    assert storage(fetch) == expected  # the writer asks the scheduler for the room
    assert fetch["command"][2] == sources.FETCH_SCRIPT
    assert "model-cache" not in by_name(p["volumes"])
    assert "fsGroupChangePolicy" not in p["securityContext"]


def test_a_spec_size_bounds_a_hub_model_and_its_writer_the_engine() -> None:
    hub = {"huggingFace": {"repo": "ggml-org/tiny"}}
    p = pod(hub, {"sizeLimit": "20Gi"})
    assert by_name(p["volumes"])["models"]["emptyDir"] == {"sizeLimit": "20Gi"}
    assert storage(p["containers"][0]) == "20736Mi"  # the model and 256Mi under HOME
    assert "initContainers" not in p


def test_a_spec_size_bounds_an_s3_model_and_its_copier() -> None:
    p = pod({"uri": "s3://models/m.gguf"}, {"sizeLimit": "3Gi"})
    assert by_name(p["volumes"])["models"]["emptyDir"] == {"sizeLimit": "3Gi"}
    assert storage(p["initContainers"][0]) == "3Gi"
    assert storage(p["containers"][0]) == "256Mi"  # the engine writes only HOME


def test_a_size_nobody_knows_is_left_unbounded_but_home_is_always_bounded() -> None:
    p = pod({"uri": "s3://models/m.gguf"})
    volumes = by_name(p["volumes"])
    assert volumes["models"] == {"name": "models", "emptyDir": {}}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {"sizeLimit": caching.SCRATCH_LIMIT}}
    assert "ephemeral-storage" not in p["initContainers"][0]["resources"]["requests"]


def test_the_users_ephemeral_storage_figure_stands() -> None:
    resources = {"requests": {"ephemeral-storage": "1Gi"}, "limits": {"ephemeral-storage": "2Gi"}}
    p = pod({"huggingFace": {"repo": "ggml-org/tiny"}}, {"sizeLimit": "20Gi"},
            resources=resources)  # fmt: skip
    assert p["containers"][0]["resources"] == {
        "requests": {"ephemeral-storage": "1Gi", "cpu": "500m", "memory": "1Gi"},
        "limits": {"ephemeral-storage": "2Gi"},
    }
    only_limit = {"limits": {"ephemeral-storage": "2Gi"}}  # a request would default to it
    p = pod({"huggingFace": {"repo": "ggml-org/tiny"}}, resources=only_limit)
    assert p["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}


@pytest.mark.parametrize(
    ("size", "text"),
    [(1, "1Mi"), (2**20, "1Mi"), (2**20 + 1, "2Mi"), (1536 * 2**20, "1536Mi"),
     (2**30, "1Gi"), (2**40, "1Ti"), (2**50 + 1, "1073741825Mi")],
)  # fmt: skip
def test_sizes_are_written_as_the_api_server_writes_them(size: int, text: str) -> None:
    assert caching.quantity(size) == text


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"source": {"huggingFace": {"repo": "a/b"}}, "modelVolume": {"cacheClaim": "cache"}},
         r"cacheClaim needs a registry: source"),
        ({"source": {"uri": "s3://models/m"}, "modelVolume": {"cacheClaim": "cache"}},
         r"cacheClaim needs a registry: source"),
        ({"source": {"registry": "m"}, "modelVolume": {"cacheClaim": "Not_A_Name"}},
         r"spec\.modelVolume\.cacheClaim"),
        ({"source": {"registry": "m"}, "modelVolume": {"sizeLimit": "0Gi"}},
         r"spec\.modelVolume\.sizeLimit"),
        ({"source": {"registry": "m"}, "modelVolume": {"sizeLimit": "100000Ti"}},
         r"spec\.modelVolume\.sizeLimit"),
        ({"source": {"registry": "m"}, "modelVolume": {"sizeLimit": "1Pi"}},
         r"spec\.modelVolume\.sizeLimit"),
        ({"source": {"registry": "m"}, "modelVolume": {"sizeLimit": "1.5Gi"}},
         r"spec\.modelVolume\.sizeLimit"),
    ],
)  # fmt: skip
def test_cache_and_size_fields_are_checked(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSpec, match=message):
        decode_spec(GGUF | fields)


def test_a_registry_model_too_large_to_be_a_volume_is_refused() -> None:
    s = decode_spec(GGUF | {"source": {"registry": "tiny"}})
    huge = registry({"a.gguf": 2**49, "b.bin": 2**49 + 1})
    with pytest.raises(InvalidSpec, match="more than 1 PiB"):
        sources.check(s, huge.weights)
