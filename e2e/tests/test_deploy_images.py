"""The manifests run exactly the images `make image` builds, under the same names and versions.

`deploy/image/common.sh` tags `docker.io/fleet/<package>:<package version>`; containerd (k3s)
reads an unqualified `fleet/x` the same way, podman does not, so the manifests spell the name in
full. A version bump in a pyproject without the manifests following would leave a cluster pulling
an image no archive holds (ImagePullBackOff): this test catches it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def version(package: str) -> str:
    with (ROOT / package / "pyproject.toml").open("rb") as handle:
        found: str = tomllib.load(handle)["project"]["version"]
    return found


def manifest_images() -> dict[str, set[str]]:
    """Manifest file → the fleet images it names."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        names = re.findall(r"^\s*image:\s*(\S*fleet/fleet-[\w-]+:\S+)", path.read_text(), re.M)
        if names:
            found[path.name] = set(names)
    return found


@pytest.mark.parametrize(
    ("manifest", "package"),
    [
        ("control-plane.yaml", "fleet-core"),
        ("gateway.yaml", "fleet-core"),
        ("operator.yaml", "fleet-serving"),
    ],
)
def test_each_deployment_runs_the_image_make_image_tags(manifest: str, package: str) -> None:
    assert manifest_images()[manifest] == {f"docker.io/fleet/{package}:{version(package)}"}


def test_no_manifest_names_another_fleet_image() -> None:
    assert set(manifest_images()) == {"control-plane.yaml", "gateway.yaml", "operator.yaml"}


def test_the_image_scripts_tag_those_names() -> None:
    common = (ROOT / "deploy/image/common.sh").read_text()
    assert 'core_image="docker.io/fleet/fleet-core:$core_version"' in common
    assert 'serving_image="docker.io/fleet/fleet-serving:$serving_version"' in common
    assert 'archive="$root/build/fleet-images-$core_version.tar"' in common
