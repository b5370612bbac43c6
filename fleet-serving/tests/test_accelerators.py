"""Accelerator profiles rendered: each vendor's documented resource name, image and host mounts.

The names asserted here are the ones docs/operator.md ("Accelerators") cites: NVIDIA's device
plugin (``nvidia.com/gpu``, ``nvidia.com/mig-<profile>`` under the mixed MIG strategy), AMD's
(``amd.com/gpu``), Huawei's (``huawei.com/Ascend910``) and vllm-ascend's quick-start mounts.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet_contract import CardShare
from fleet_serving import devices, profiles, rendering
from fleet_serving.errors import InvalidSpec
from fleet_serving.view import model_view

from .conftest import fleetmodel
from .test_rendering import OWNER, spec


def pod_of(**fields: Any) -> dict[str, Any]:
    s = spec(**fields)
    return dict(rendering.deployment(OWNER, s, profiles.check(s))["spec"]["template"]["spec"])


def limits(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["containers"][0]["resources"]["limits"])


def test_nvidia_whole_gpus_are_the_default() -> None:
    pod = pod_of(gpusPerReplica=2)
    c = pod["containers"][0]
    assert limits(pod) == {"nvidia.com/gpu": "2"}
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert c["image"] == "vllm/vllm-openai:v0.11.0"
    assert "command" not in c  # the image's entrypoint is the OpenAI server
    assert "affinity" in pod
    assert not [v for v in pod["volumes"] if "hostPath" in v]


def test_a_mig_profile_asks_for_its_slice_and_keeps_the_cuda_images() -> None:
    pod = pod_of(accelerator={"vendor": "nvidia", "migProfile": "1g.10gb"})
    assert limits(pod) == {"nvidia.com/mig-1g.10gb": "1"}
    assert {"key": "nvidia.com/mig-1g.10gb", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["containers"][0]["image"] == "vllm/vllm-openai:v0.11.0"
    assert "affinity" not in pod  # MIG exists only on Ampere and later (compute ≥ 8.0)
    gguf = pod_of(engine="llamacpp", weightFormat="gguf",
                  accelerator={"migProfile": "3g.40gb"})  # fmt: skip
    assert limits(gguf) == {"nvidia.com/mig-3g.40gb": "1"}
    assert gguf["containers"][0]["image"] == "ghcr.io/ggml-org/llama.cpp:server-cuda-b6800"


def test_a_mig_profile_refuses_more_than_one_device_per_replica() -> None:
    with pytest.raises(InvalidSpec, match="a CUDA process sees one MIG device"):
        profiles.check(spec(gpusPerReplica=2, accelerator={"migProfile": "1g.10gb"}))


def test_amd_gpus_run_the_rocm_builds() -> None:
    pod = pod_of(accelerator={"vendor": "amd"}, gpusPerReplica=8)
    c = pod["containers"][0]
    assert limits(pod) == {"amd.com/gpu": "8"}
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert c["image"] == "rocm/vllm:rocm7.0.0_vllm_0.11.2_20251210"
    assert c["command"] == ["vllm", "serve"]  # AMD's image starts a shell
    assert c["args"][:3] == ["Qwen/Qwen3-8B", "--revision", "abc123"]
    assert "--tensor-parallel-size" in c["args"]
    assert "affinity" not in pod  # no NVIDIA GFD labels on an AMD node
    assert not [v for v in pod["volumes"] if "hostPath" in v]
    gguf = pod_of(engine="llamacpp", weightFormat="gguf", accelerator={"vendor": "amd"})
    assert gguf["containers"][0]["image"] == "ghcr.io/ggml-org/llama.cpp:server-rocm-b6800"
    assert "command" not in gguf["containers"][0]  # its entrypoint is llama-server


def test_ascend_npus_run_vllm_ascend_with_the_driver_mounted_read_only() -> None:
    pod = pod_of(accelerator={"vendor": "huawei"})
    c = pod["containers"][0]
    assert limits(pod) == {"huawei.com/Ascend910": "1"}
    assert c["image"] == "quay.io/ascend/vllm-ascend:v0.13.0"
    assert c["command"] == ["vllm", "serve"]
    host = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    assert host == {
        "ascend-dcmi": {"path": "/usr/local/dcmi", "type": "Directory"},
        "ascend-npu-smi": {"path": "/usr/local/bin/npu-smi", "type": "File"},
        "ascend-driver-lib64": {"path": "/usr/local/Ascend/driver/lib64", "type": "Directory"},
        "ascend-driver-version": {"path": "/usr/local/Ascend/driver/version.info",
                                  "type": "File"},
        "ascend-install-info": {"path": "/etc/ascend_install.info", "type": "File"},
    }  # fmt: skip
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    for name, source in host.items():
        assert mounts[name] == {"name": name, "mountPath": source["path"], "readOnly": True}
    # The container stays unprivileged: the device plugin gives the /dev/davinci* nodes.
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in c["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_llamacpp_on_ascend_has_no_official_image_unless_one_is_given() -> None:
    fields = {"engine": "llamacpp", "weightFormat": "gguf", "accelerator": {"vendor": "huawei"}}
    with pytest.raises(InvalidSpec, match=r"llama\.cpp publishes no image for Ascend NPUs"):
        profiles.check(spec(**fields))
    own = pod_of(**fields, image="registry.example/llama-cpp-cann:b6800")
    assert own["containers"][0]["image"] == "registry.example/llama-cpp-cann:b6800"
    assert "command" not in own["containers"][0]  # the user's image keeps its entrypoint
    assert limits(own) == {"huawei.com/Ascend910": "1"}


def test_a_cpu_model_asks_for_no_device_whatever_its_accelerator() -> None:
    pod = pod_of(engine="llamacpp", weightFormat="gguf", gpusPerReplica=0,
                 accelerator={"vendor": "huawei"})  # fmt: skip
    assert pod["containers"][0]["image"] == "ghcr.io/ggml-org/llama.cpp:server-b6800"
    assert not [v for v in pod["volumes"] if "hostPath" in v]
    assert "limits" not in pod["containers"][0]["resources"]


def test_ascend_is_refused_outside_a_host_mount_namespace() -> None:
    body = fleetmodel("npu", accelerator={"vendor": "huawei"})
    refused = model_view(body)
    assert refused.error is not None
    assert "Pod Security restricted and baseline forbid" in refused.error
    assert "namespace default" in refused.error
    allowed = model_view(body, frozenset({"default"}))
    assert allowed.error is None
    amd = model_view(fleetmodel("mi300", accelerator={"vendor": "amd"}))
    assert amd.error is None  # no host path: any models namespace


@pytest.mark.parametrize(
    ("profile", "product", "share"),
    [
        ("1g.10gb", None, (1, 7)),  # H100 80GB / A100 80GB
        ("3g.40gb", None, (3, 7)),
        ("7g.80gb", None, (7, 7)),
        ("1g.5gb+me", None, (1, 7)),
        ("1g.6gb", None, (1, 4)),  # A30: four compute slices
        ("2g.12gb", None, (2, 4)),
        ("4g.24gb", None, (4, 4)),
        ("1g.6gb+me", "NVIDIA-A30", (1, 4)),
        ("2g.12gb", "NVIDIA-A30", (2, 4)),
        ("1g.12gb", "NVIDIA-H100-NVL", (1, 7)),
    ],
)
def test_a_mig_slice_is_its_compute_slices_over_the_cards(
    profile: str, product: str | None, share: tuple[int, int]
) -> None:
    assert devices.card_share(profile, product) == CardShare(numerator=share[0],
                                                             denominator=share[1])  # fmt: skip


def test_what_is_not_a_mig_profile_has_no_share() -> None:
    assert devices.card_share("gpu") is None
    assert devices.card_share("7g.24gb", "NVIDIA-A30") is None  # more slices than the card
