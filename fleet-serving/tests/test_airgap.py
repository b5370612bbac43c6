"""What an air-gapped cluster needs: the weight fetchers' images from its own mirror (operator-wide
and per FleetModel), pull Secrets on the pod, and a gated model's token under its own key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet_serving import images, profiles, rendering
from fleet_serving.errors import ConfigError, InvalidSpec
from fleet_serving.settings import fetch_images, parse_args
from fleet_serving.spec import decode_spec

from .test_rendering import OWNER, REGISTRY, spec

MIRROR = "registry.local:5000/tools/curl:8.11.1"
S3_MIRROR = "registry.local:5000/amazon/aws-cli@sha256:" + "a" * 64
GGUF: dict[str, Any] = {"engine": "llamacpp", "weightFormat": "gguf", "gpusPerReplica": 0}
S3 = GGUF | {"source": {"uri": "s3://models/m.gguf"}}
FROM_REGISTRY = GGUF | {"source": {"registry": "gemma"}}


def pod(fields: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    s = spec(**fields)
    registry = REGISTRY if s.source.registry else None
    d = rendering.deployment(OWNER, s, profiles.check(s), registry, **kwargs)
    return dict(d["spec"]["template"]["spec"])


def test_the_default_fetchers_are_pinned_public_images() -> None:
    assert pod(S3)["initContainers"][0]["image"] == "amazon/aws-cli:2.31.0"
    assert pod(FROM_REGISTRY)["initContainers"][0]["image"] == "curlimages/curl:8.11.1"


def test_the_operators_fetch_images_replace_the_defaults() -> None:
    fetch = images.FetchImages(registry=MIRROR, s3=S3_MIRROR)
    assert pod(S3, fetch=fetch)["initContainers"][0]["image"] == S3_MIRROR
    assert pod(FROM_REGISTRY, fetch=fetch)["initContainers"][0]["image"] == MIRROR


def test_a_fleetmodels_fetch_image_replaces_the_operators() -> None:
    own = "mirror.corp/fetch/aws-cli:2.31.0"
    fetch = images.FetchImages(registry=MIRROR, s3=S3_MIRROR)
    assert pod(S3 | {"fetchImage": own}, fetch=fetch)["initContainers"][0]["image"] == own
    chosen = pod(FROM_REGISTRY | {"fetchImage": own}, fetch=fetch)["initContainers"][0]
    assert chosen["image"] == own


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"fetchImage": "curlimages/curl"}, "spec.fetchImage: Expected `str` matching regex"),
        ({"fetchImage": "Curl:1 ;rm"}, "spec.fetchImage: Expected `str` matching regex"),
        ({"fetchImage": "mirror/curl:8"}, "spec.fetchImage is for registry and uri sources"),
        ({"imagePullSecrets": [{"name": "Bad_Name"}]}, "spec.imagePullSecrets[0].name"),
        ({"imagePullSecrets": [{"name": f"s{i}"} for i in range(17)]}, "spec.imagePullSecrets"),
    ],
)
def test_bad_images_and_pull_secrets_are_invalid_specs(
    fields: dict[str, Any], message: str
) -> None:
    base = {"servedModelName": "q", "engine": "vllm", "weightFormat": "safetensors",
            "source": {"huggingFace": {"repo": "Qwen/Qwen3-8B"}}}  # fmt: skip
    with pytest.raises(InvalidSpec) as refused:
        decode_spec(base | fields)
    assert message in str(refused.value)


def test_pull_secrets_reach_the_pod() -> None:
    rendered = pod({"imagePullSecrets": [{"name": "mirror"}, {"name": "hub.corp"}]})
    assert rendered["imagePullSecrets"] == [{"name": "mirror"}, {"name": "hub.corp"}]
    assert "imagePullSecrets" not in pod({})  # the API server drops an empty list


def test_a_gated_models_token_key_defaults_to_token() -> None:
    s = spec(hfTokenSecret={"name": "hf"})
    assert s.hf_token_secret is not None
    assert s.hf_token_secret.key == "token"
    assert s.api_key_secret is None
    env = {e["name"]: e for e in pod({"hfTokenSecret": {"name": "hf"}})["containers"][0]["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    keyed = spec(apiKeySecret={"name": "k"})
    assert keyed.api_key_secret is not None
    assert keyed.api_key_secret.key == "api-key"


def test_the_crd_defaults_each_secret_key_on_its_own() -> None:
    crd = Path(__file__).parents[2] / "deploy" / "base" / "crd.yaml"
    text = crd.read_text()
    token = text[text.index("hfTokenSecret:") :]
    assert token[: token.index("nullable")].count("default: token") == 1
    key = text[text.index("apiKeySecret:") :]
    assert key[: key.index("nullable")].count("default: api-key") == 1


def test_the_environment_sets_the_operators_fetch_images() -> None:
    environ = {"FLEET_SERVING_FETCH_IMAGE": MIRROR, "FLEET_SERVING_S3_FETCH_IMAGE": S3_MIRROR}
    assert fetch_images(environ) == images.FetchImages(registry=MIRROR, s3=S3_MIRROR)
    assert fetch_images({"FLEET_SERVING_FETCH_IMAGE": ""}) == images.DEFAULT


@pytest.mark.parametrize("value", ["curlimages/curl", "curl:latest extra", "HTTPS://x/curl:1"])
def test_an_unpinned_or_malformed_fetch_image_refuses_to_start(value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        fetch_images({"FLEET_SERVING_S3_FETCH_IMAGE": value})
    said = str(refused.value)
    assert said.startswith(f"FLEET_SERVING_S3_FETCH_IMAGE: {value!r} is not a pinned image")
    assert "\n" not in said


def test_the_cli_refuses_a_bad_fetch_image_with_one_line(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("fsc_x\n")
    argv = ["run", "--report-to=http://cp:8081", f"--report-token-file={token}"]
    settings = parse_args(argv, {"FLEET_SERVING_FETCH_IMAGE": MIRROR})
    assert settings.fetch_images.registry == MIRROR
    done = subprocess.run(
        [sys.executable, "-m", "fleet_serving", *argv],
        env={"FLEET_SERVING_FETCH_IMAGE": "curl", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "FLEET_SERVING_FETCH_IMAGE: 'curl' is not a pinned image reference" in done.stderr
