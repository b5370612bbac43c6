#!/usr/bin/env bash
# Install k3s on this machine and apply Fleet's k3s overlay.
#
# Usage:  make image && sudo deploy/k3s-bootstrap.sh      (from the repository root)
#
# What it does, in order:
#   1. installs k3s (single node; its bundled Traefik serves the gateway on port 80) unless a
#      `k3s` binary is already present; K3S_VERSION pins a release (default: the stable channel);
#   2. waits until the node is Ready, then imports Fleet's images into k3s's containerd from the
#      archive `make image` wrote (FLEET_IMAGES, default build/fleet-images-<fleet-core
#      version>.tar): no registry is needed, and the manifests name exactly those tags;
#   3. creates what deploy/ ships no default for (docs/security.md), each only if it is missing:
#      the control plane's admin token (random), and, without a fleet-core Secret, one holding a
#      random gateway API key (printed once) so the gateway serves closed, never anonymously;
#      and the engine keys (ADR 0010, 0020): the Secret fleet-engine-key, key api-key, holds the
#      fleet engine secret (random) in fleet-system (mounted by the gateway) and cluster k3s's
#      key, HMAC-SHA256 of "k3s" under that secret, in default (read by the engines);
#   4. applies deploy/overlays/k3s (the FleetModel CRD, RBAC, operator, control plane, gateway),
#      waits for the control plane, issues the operator (cluster k3s), gateway, engine and metrics
#      credentials through its API and stores each in its Secret, binds cluster k3s to its pod
#      network (10.42.0.0/16) and no model yet, then waits for the rest. A FleetModel serves
#      once the admin binds its served model name (the command is printed at the end).
#
# GPUs: for vLLM models, install the NVIDIA container toolkit before k3s (k3s then registers the
# `nvidia` runtime) and the NVIDIA device plugin + GPU feature discovery afterwards, so nodes
# advertise nvidia.com/gpu and the nvidia.com/gpu.compute.* labels the operator places by.
# Without them, llama.cpp models still run on CPU. GPU FleetModels set `runtimeClassName: nvidia`
# (k3s's default runtime is not the NVIDIA one). It cannot run in a container without systemd.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/../fleet-core/pyproject.toml")
images="${FLEET_IMAGES:-$here/../build/fleet-images-$version.tar}"

if [[ "$(id -u)" -ne 0 ]]; then
  echo "k3s-bootstrap: run as root (sudo), it installs a system service" >&2
  exit 1
fi

if [[ ! -s $images ]]; then
  echo "k3s-bootstrap: no image archive at $images: run \`make image\` first (or set FLEET_IMAGES)" >&2
  exit 1
fi

if ! command -v k3s >/dev/null 2>&1; then
  echo "k3s-bootstrap: installing k3s ${K3S_VERSION:-(stable)}"
  curl -sfL https://get.k3s.io | INSTALL_K3S_VERSION="${K3S_VERSION:-}" sh -s - \
    --write-kubeconfig-mode 0644
fi

export KUBECONFIG=/etc/rancher/k3s/k3s.yaml
kubectl="k3s kubectl"

echo "k3s-bootstrap: waiting for the node"
$kubectl wait --for=condition=Ready node --all --timeout=180s

echo "k3s-bootstrap: importing $images"
k3s ctr --namespace k8s.io images import "$images"

random() { openssl rand -hex 32; }
missing() { ! $kubectl -n "$1" get secret "$2" >/dev/null 2>&1; }
# A Secret from stdin (never from argv, where `ps` would show it).
store() { $kubectl -n "$1" create secret generic "$2" --from-file=token=/dev/stdin >/dev/null; }

$kubectl apply -f "$here/base/namespace.yaml"
# Engine pods in `default` may fetch registry weights (deploy/base/network-policies.yaml).
$kubectl label --overwrite namespace default serving.fleet.dev/models=true >/dev/null
if missing fleet-system fleet-admin-token; then
  random | store fleet-system fleet-admin-token
fi
# The engine keys: the fleet secret in the gateway's namespace, and this cluster's key, derived
# from it, in every model namespace (here default; copy it into each namespace you create
# FleetModels in). The secret goes through stdin, never argv. Kept if already there.
engine_key="$($kubectl -n fleet-system get secret fleet-engine-key -o jsonpath='{.data.api-key}' \
  2>/dev/null | base64 -d || true)"
engine_key="${engine_key:-$(random)}"
secret_key() {  # namespace, value on stdin
  $kubectl -n "$1" create secret generic fleet-engine-key --from-file=api-key=/dev/stdin >/dev/null
}
cluster_key() {  # the cluster's engine key, from the fleet secret on stdin (fleet_core.shared.engine_keys)
  python3 -c 'import hashlib, hmac, sys
print(hmac.new(sys.stdin.read().encode(), sys.argv[1].encode(), hashlib.sha256).hexdigest(), end="")' "$1"
}
if missing fleet-system fleet-engine-key; then printf '%s' "$engine_key" | secret_key fleet-system; fi
if missing default fleet-engine-key; then
  printf '%s' "$engine_key" | cluster_key k3s | secret_key default
fi
unset engine_key
if missing fleet-system fleet-core; then
  key="demo/default/$(random)"
  printf 'FLEET_API_KEYS=%s\n' "$key" | $kubectl -n fleet-system create secret generic \
    fleet-core --from-env-file=/dev/stdin >/dev/null
  echo "k3s-bootstrap: the gateway's API key (shown once): $key"
fi

echo "k3s-bootstrap: applying deploy/overlays/k3s"
$kubectl apply -k "$here/overlays/k3s"
$kubectl wait --for=condition=Established crd/fleetmodels.serving.fleet.dev --timeout=60s
$kubectl -n fleet-system rollout status deployment/fleet-apiserver --timeout=300s

# Credentials are issued by the control plane itself, through a port-forward (which a
# NetworkPolicy does not stop), with the admin token.
$kubectl -n fleet-system port-forward svc/fleet-apiserver 18081:8081 >/dev/null 2>&1 &
forward=$!
trap 'kill "$forward" 2>/dev/null || true' EXIT
admin="$($kubectl -n fleet-system get secret fleet-admin-token -o jsonpath='{.data.token}' \
  | base64 -d)"
for _ in $(seq 50); do curl -sf http://127.0.0.1:18081/healthz >/dev/null && break; sleep 0.2; done
issue() {  # role, namespace, secret[, clusterId]: the new credential's secret into the Secret
  local body="{\"role\": \"$1\", \"label\": \"k3s-bootstrap\"${4:+, \"clusterId\": \"$4\"}}"
  if missing "$2" "$3"; then
    curl -sf http://127.0.0.1:18081/api/v1/credentials -H "Content-Type: application/json" \
      -H @<(printf 'Authorization: Bearer %s\n' "$admin") -d "$body" \
      | python3 -c 'import json, sys; print(json.load(sys.stdin)["secret"])' | store "$2" "$3"
  fi
}
issue operator fleet-system fleet-operator-token k3s
issue gateway fleet-system fleet-gateway-token
issue metrics fleet-system fleet-metrics-token
issue engine default fleet-engine-token
# What cluster k3s may serve is the admin's decision (ADR 0020): its pod network, no model yet.
if ! curl -sf http://127.0.0.1:18081/api/v1/clusters/k3s/binding \
    -H @<(printf 'Authorization: Bearer %s\n' "$admin") >/dev/null; then
  curl -sf -X PUT http://127.0.0.1:18081/api/v1/clusters/k3s/binding \
    -H "Content-Type: application/json" -H @<(printf 'Authorization: Bearer %s\n' "$admin") \
    -d '{"servedModels": [], "endpoints": ["10.42.0.0/16"]}' >/dev/null
fi
for deployment in fleet-gateway fleet-serving; do
  $kubectl -n fleet-system rollout restart "deployment/$deployment" >/dev/null
  $kubectl -n fleet-system rollout status "deployment/$deployment" --timeout=300s
done

echo "k3s-bootstrap: done. Try: kubectl get fm -A; curl http://localhost/v1/models -H \"Authorization: Bearer \$KEY\""
echo "k3s-bootstrap: a FleetModel serves once its served model name is bound to cluster k3s:"
echo "  PUT /api/v1/clusters/k3s/binding {\"servedModels\": [\"<name>\", …], \"endpoints\": [\"10.42.0.0/16\"]}"
echo "k3s-bootstrap: without FLEET_DATABASE_URL the control plane keeps credentials in memory;"
echo "  after it restarts, delete fleet-operator-token, fleet-gateway-token, fleet-metrics-token"
echo "  and default/fleet-engine-token and run this again (or give it a database)."
