"""The CRD is generated from the code, and deploy/ builds with kustomize."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_serving import crd, rendering
from fleet_serving.applying import drifted

from .shipped import CLUSTER_GRANTS, DEPLOY, MODELS_GRANTS, kustomize, rendered_rbac


def test_committed_crd_matches_the_code() -> None:
    committed = (DEPLOY / "base" / "crd.yaml").read_text()
    assert committed == crd.render_yaml(), (
        "deploy/base/crd.yaml is stale: run `python -m fleet_serving.crd > deploy/base/crd.yaml`"
    )


def walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, sub in (schema.get("properties") or {}).items():
        found += walk(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += walk(schema[key], f"{path}[{key}]")
    return found


def test_the_crd_schema_is_structural_with_validation_and_columns() -> None:
    manifest = crd.crd_manifest()
    (version,) = manifest["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        assert "type" in node, f"{path} has no type (not structural)"
        assert not {"$ref", "anyOf", "title", "$defs"} & node.keys(), path
    spec = schema["properties"]["spec"]
    assert spec["required"] == ["servedModelName", "source", "weightFormat", "engine"]
    assert spec["properties"]["engine"]["enum"] == ["llamacpp", "vllm"]
    assert spec["properties"]["weightFormat"]["enum"] == ["gguf", "safetensors"]
    assert spec["properties"]["replicas"]["minimum"] == 0
    assert schema["properties"]["status"]["properties"]["phase"]["enum"] == [
        "Failed", "Pending", "Ready", "Scheduling"]  # fmt: skip
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Model", "Engine", "Replicas", "Ready", "Phase", "Age"]  # fmt: skip
    assert manifest["spec"]["names"]["shortNames"] == ["fm"]
    assert manifest["spec"]["scope"] == "Namespaced"


@pytest.mark.parametrize("where", ["base", "overlays/k3s"])
def test_kustomize_builds(where: str) -> None:
    objects = kustomize(DEPLOY / where)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("CustomResourceDefinition", "fleetmodels.serving.fleet.dev") in kinds
    for name in ("fleet-serving", "fleet-apiserver", "fleet-gateway"):
        assert ("Deployment", name) in kinds
    assert ("Service", "fleet-gateway") in kinds
    assert ("Service", "fleet-apiserver") in kinds
    assert ("ClusterRole", "fleet-serving") in kinds
    assert ("ClusterRole", "fleet-serving-models") in kinds
    assert ("Namespace", "fleet-models") in kinds
    (built_crd,) = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    assert not drifted(crd.crd_manifest()["spec"], built_crd["spec"])
    gateway = next(o for o in objects if o["kind"] == "Deployment" and
                   o["metadata"]["name"] == "fleet-gateway")  # fmt: skip
    assert gateway["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


IMAGE_COMMANDS = {"fleet-gateway", "fleet-apiserver", "fleet-serving"}
"""What Fleet's images hold (deploy/image/Dockerfile). They set a CMD, no ENTRYPOINT: a
container that gives only ``args`` would run its first argument as the program."""


@pytest.mark.parametrize("where", ["base", "overlays/k3s", "overlays/test-node"])
def test_every_fleet_container_names_its_program(where: str) -> None:
    for workload in kustomize(DEPLOY / where):
        if workload["kind"] != "Deployment":
            continue
        for container in workload["spec"]["template"]["spec"]["containers"]:
            if container["image"].startswith("docker.io/fleet/"):
                assert container.get("command", [""])[0] in IMAGE_COMMANDS, container["name"]


def grants(role: dict[str, Any]) -> dict[str, frozenset[str]]:
    """A role's rules as resource[.group][/subresource] → verbs, as ``kubectl auth can-i --list``
    names them (:mod:`shipped`)."""
    found: dict[str, frozenset[str]] = {}
    for rule in role["rules"]:
        assert not rule.get("resourceNames"), rule
        assert not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                plural, _, sub = resource.partition("/")
                name = (f"{plural}.{group}" if group else plural) + (f"/{sub}" if sub else "")
                found[name] = found.get(name, frozenset()) | frozenset(rule["verbs"])
    return found


def test_rbac_grants_only_the_reviewed_list() -> None:
    """Two ClusterRoles: the cluster-wide one bound by a ClusterRoleBinding, the namespaced one
    only by RoleBindings, each in a namespace the operator is told to watch."""
    rbac = rendered_rbac()
    roles = {r["metadata"]["name"]: r for r in rbac["ClusterRole"]}
    assert roles.keys() == {"fleet-serving", "fleet-serving-models"}
    assert grants(roles["fleet-serving"]) == CLUSTER_GRANTS
    assert grants(roles["fleet-serving-models"]) == MODELS_GRANTS
    (account,) = rbac["ServiceAccount"]
    subject = {"kind": "ServiceAccount", "name": "fleet-serving", "namespace": "fleet-system"}
    assert account["metadata"]["name"] == subject["name"]
    assert account["metadata"]["namespace"] == subject["namespace"]
    (cluster_binding,) = rbac["ClusterRoleBinding"]
    assert cluster_binding["roleRef"]["name"] == "fleet-serving"
    assert cluster_binding["subjects"] == [subject]
    (binding,) = rbac["RoleBinding"]
    assert binding["metadata"]["namespace"] == "fleet-models"
    assert binding["roleRef"]["kind"] == "ClusterRole"
    assert binding["roleRef"]["name"] == "fleet-serving-models"
    assert binding["subjects"] == [subject]
    pairs = {(name, verb) for name, verbs in (MODELS_GRANTS | CLUSTER_GRANTS).items()
             for verb in verbs}  # fmt: skip
    assert not {"delete", "deletecollection", "*"} & {v for _, v in pairs}  # owner refs delete
    assert {n for n, v in pairs if v == "update"} == {"fleetmodels.serving.fleet.dev/finalizers"}
    assert not {n for n, _ in pairs if n.startswith(("secrets", "*"))}


def watched_and_bound(objects: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """The operator's ``--namespace``s, and the namespaces with a RoleBinding of its role."""
    pod = deployment_of(objects, "fleet-serving")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert "--all-namespaces" not in args
    watched = {a.removeprefix("--namespace=") for a in args if a.startswith("--namespace=")}
    bound = {o["metadata"]["namespace"] for o in objects if o["kind"] == "RoleBinding"
             and o["roleRef"]["name"] == "fleet-serving-models"}  # fmt: skip
    return watched, bound


def assert_models_namespace(objects: list[dict[str, Any]], name: str) -> None:
    """Labelled for the NetworkPolicies, Pod Security's restricted profile enforced (it bounds
    what the operator's Deployments may run), and the engines' NetworkPolicy in it."""
    (namespace,) = [o for o in objects if o["kind"] == "Namespace" and
                    o["metadata"]["name"] == name]  # fmt: skip
    labels = namespace["metadata"]["labels"]
    assert labels["serving.fleet.dev/models"] == "true"
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
    assert any(o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "fleet-engines" and
               o["metadata"]["namespace"] == name for o in objects)  # fmt: skip


@pytest.mark.parametrize("where", ["base", "overlays/k3s", "overlays/test-node"])
def test_the_operator_watches_exactly_the_bound_namespaces(where: str) -> None:
    """A namespace it watches without a RoleBinding would be refused; one bound but not watched
    would hold a grant nothing uses."""
    objects = kustomize(DEPLOY / where)
    assert watched_and_bound(objects) == ({"fleet-models"}, {"fleet-models"})
    assert_models_namespace(objects, "fleet-models")


def test_the_readme_adds_a_models_namespace_as_it_says(tmp_path: Path) -> None:
    """deploy/README.md's "Another models namespace" overlay, built: one more RoleBinding and
    one more --namespace, and nothing else about the operator changes."""
    readme = (DEPLOY / "README.md").read_text()
    section = readme.split("## Another models namespace", 1)[1].split("\n## ", 1)[0]
    kustomization, extra = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)
    k3s = os.path.relpath(DEPLOY / "overlays" / "k3s", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(kustomization.replace("../k3s", k3s))
    (tmp_path / "team-a.yaml").write_text(extra)
    objects = kustomize(tmp_path)
    assert watched_and_bound(objects) == ({"fleet-models", "team-a"},) * 2
    assert_models_namespace(objects, "team-a")

    def cluster_wide(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]

    assert cluster_wide(objects) == cluster_wide(kustomize(DEPLOY / "overlays" / "k3s"))


def test_k3s_overlay_changes_what_it_says() -> None:
    objects = kustomize(DEPLOY / "overlays" / "k3s")
    gateway = next(o for o in objects if o["metadata"]["name"] == "fleet-gateway" and
                   o["kind"] == "Deployment")  # fmt: skip
    assert gateway["spec"]["replicas"] == 1
    (ingress,) = [o for o in objects if o["kind"] == "Ingress"]
    # HTTPS only: the router is on Traefik's websecure entry point alone, so port 80 serves no
    # /v1 a client could send its key to in clear.
    assert ingress["spec"]["tls"] == [{"secretName": "fleet-gateway-tls"}]
    annotations = ingress["metadata"]["annotations"]
    assert annotations["traefik.ingress.kubernetes.io/router.entrypoints"] == "websecure"
    assert annotations["traefik.ingress.kubernetes.io/router.tls"] == "true"
    assert "gateway-tls.sh" in (DEPLOY / "install.sh").read_text()


@pytest.mark.parametrize("where", ["base", "overlays/k3s", "overlays/test-node"])
def test_the_gateways_grace_outlasts_its_drain(where: str) -> None:
    """Deleted, the gateway keeps accepting through preStop while kube-proxies and the ingress
    drop it, then drains for FLEET_SHUTDOWN_GRACE_S; the kubelet's grace counts both, so it must
    be longer, or SIGKILL cuts the streams the drain was finishing."""
    pod = deployment_of(kustomize(DEPLOY / where), "fleet-gateway")["spec"]["template"]["spec"]
    (gateway,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in gateway["env"]}
    sleep = gateway["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = float(env["FLEET_SHUTDOWN_GRACE_S"])
    assert sleep >= 5
    assert drain >= 60  # a long stream, as an engine's default drain
    assert pod["terminationGracePeriodSeconds"] >= sleep + drain + 5


def test_only_the_monitoring_namespace_reaches_the_unauthenticated_metrics_port() -> None:
    objects = kustomize(DEPLOY / "base")
    policies = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "NetworkPolicy"}
    policy = policies["fleet-gateway"]
    labels = deployment_of(objects, "fleet-gateway")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    open_to_all, metrics = policy["ingress"]
    assert "from" not in open_to_all
    assert open_to_all["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert metrics["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert metrics["ports"] == [{"port": 9090, "protocol": "TCP"}]


def test_drift_is_a_subset_comparison() -> None:
    desired = {"spec": {"replicas": 2, "template": {"containers": [{"image": "a"}]}}}
    defaulted = {"spec": {"replicas": 2, "paused": False,
                          "template": {"containers": [{"image": "a", "tty": False}]}}}  # fmt: skip
    assert not drifted(desired, defaulted)
    assert drifted(desired, {"spec": {"replicas": 3, "template": {"containers": [{"image": "a"}]}}})
    assert drifted(desired, {"spec": {"replicas": 2, "template": {"containers": []}}})
    assert drifted(desired, {})
    assert not drifted({"spec": {"tolerations": [], "nodeSelector": {}}}, {"spec": {}})


def deployment_of(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name
    )
    return found


@pytest.mark.parametrize("where", ["base", "overlays/k3s"])
def test_deploy_is_closed_by_default(where: str) -> None:
    """No Secret ships with a value; the gateway requires auth (an env entry, which wins over
    the fleet-core Secret's envFrom); each component reads its credential from a Secret of its
    own that must exist (not optional), so a missing one stops the pod instead of opening it."""
    objects = kustomize(DEPLOY / where)
    assert not [o for o in objects if o["kind"] == "Secret"]
    gateway = deployment_of(objects, "fleet-gateway")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in gateway["containers"][0]["env"]}
    assert env["FLEET_AUTH_REQUIRED"]["value"] == "true"
    assert env["FLEET_CONTROL_PLANE_TOKEN_FILE"]["value"].startswith("/var/run/secrets/fleet/")
    wanted = {
        "fleet-apiserver": "fleet-admin-token",
        "fleet-gateway": "fleet-gateway-token",
        "fleet-serving": "fleet-operator-token",
    }
    for name, secret in wanted.items():
        pod = deployment_of(objects, name)["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == secret]
        assert not volume["secret"].get("optional", False)
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]
    # ADR 0010: the engine key, mounted read-only, is the file FLEET_ENGINE_KEY_FILE names.
    (volume,) = [v for v in gateway["volumes"] if v.get("secret", {}).get("secretName") ==
                 "fleet-engine-key"]  # fmt: skip
    assert not volume["secret"].get("optional", False)
    (mount,) = [m for m in gateway["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert env["FLEET_ENGINE_KEY_FILE"]["value"] == mount["mountPath"] + "/api-key"
    operator = deployment_of(objects, "fleet-serving")["spec"]["template"]["spec"]
    args = operator["containers"][0]["args"]
    assert "--report-token-file=/var/run/secrets/fleet/operator/token" in args


def test_network_policies_admit_only_the_gateway_and_the_operator() -> None:
    """Their selectors are the labels the Deployments and the operator's renderer set."""
    objects = kustomize(DEPLOY / "base")
    policies = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "NetworkPolicy"}
    control = policies["fleet-apiserver"]
    apiserver = deployment_of(objects, "fleet-apiserver")["spec"]["template"]["metadata"]
    assert control["podSelector"]["matchLabels"].items() <= apiserver["labels"].items()
    (rule,) = control["ingress"]
    sources = [peer["podSelector"]["matchLabels"] for peer in rule["from"]]
    for name in ("fleet-gateway", "fleet-serving"):
        labels = deployment_of(objects, name)["spec"]["template"]["metadata"]["labels"]
        assert any(s.items() <= labels.items() for s in sources), name
    engine_labels = rendering.common_labels("m")
    assert any(s.items() <= engine_labels.items() for s in sources)  # registry weight downloads
    assert rule["ports"] == [{"port": 8081, "protocol": "TCP"}]
    engines = policies["fleet-engines"]
    # A pod label is self-assignable: no peer may be admitted by a pod label alone, from any
    # namespace; each names the namespaces it may come from.
    for peer in rule["from"]:
        assert peer.get("namespaceSelector", {}).get("matchLabels"), peer
    fleet_system = {"kubernetes.io/metadata.name": "fleet-system"}
    by_namespace = {
        tuple(sorted(p["podSelector"]["matchLabels"].items())): p["namespaceSelector"][
            "matchLabels"
        ]
        for p in rule["from"]
    }
    assert sorted(by_namespace.values(), key=str) == sorted(
        [fleet_system, fleet_system, {"serving.fleet.dev/models": "true"}], key=str
    )
    assert engines["podSelector"]["matchLabels"].items() <= engine_labels.items()
    (only,) = engines["ingress"]
    (peer,) = only["from"]
    gateway = deployment_of(objects, "fleet-gateway")["spec"]["template"]["metadata"]["labels"]
    assert peer["podSelector"]["matchLabels"].items() <= gateway.items()
    assert peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "fleet-system"
    }


def test_the_service_monitor_scrapes_the_metrics_only_port() -> None:
    """A Prometheus-operator user and an annotations user scrape the same unauthenticated port."""
    (monitor,) = yaml.safe_load_all((DEPLOY / "monitoring" / "servicemonitor.yaml").read_text())
    objects = kustomize(DEPLOY / "base")
    (service,) = [o for o in objects if o["kind"] == "Service" and
                  o["metadata"]["name"] == "fleet-gateway"]  # fmt: skip
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert str(port["port"]) == service["metadata"]["annotations"]["prometheus.io/port"]
    assert "bearerTokenSecret" not in endpoint
    assert "authorization" not in endpoint
