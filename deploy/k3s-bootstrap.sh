#!/usr/bin/env bash
# Install k3s on this machine and apply Fleet's k3s overlay.
#
# Usage:  sudo deploy/k3s-bootstrap.sh            (from the repository root)
#
# What it does, in order:
#   1. installs k3s (single node; its bundled Traefik serves the gateway on port 80) unless a
#      `k3s` binary is already present; K3S_VERSION pins a release (default: the stable channel);
#   2. waits until the node is Ready;
#   3. applies deploy/overlays/k3s (the FleetModel CRD, RBAC, operator, control plane, gateway)
#      and waits for the three Deployments to roll out.
#
# GPUs: for vLLM models, install the NVIDIA container toolkit before k3s (k3s then registers the
# `nvidia` runtime) and the NVIDIA device plugin + GPU feature discovery afterwards, so nodes
# advertise nvidia.com/gpu and the nvidia.com/gpu.compute.* labels the operator places by.
# Without them, llama.cpp models still run on CPU. GPU FleetModels set `runtimeClassName: nvidia`
# (k3s's default runtime is not the NVIDIA one). It cannot run in a container without systemd.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ "$(id -u)" -ne 0 ]]; then
  echo "k3s-bootstrap: run as root (sudo), it installs a system service" >&2
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

echo "k3s-bootstrap: applying deploy/overlays/k3s"
$kubectl apply -k "$here/overlays/k3s"
$kubectl wait --for=condition=Established crd/fleetmodels.serving.fleet.dev --timeout=60s
for deployment in fleet-apiserver fleet-gateway fleet-serving; do
  $kubectl -n fleet-system rollout status "deployment/$deployment" --timeout=300s
done

echo "k3s-bootstrap: done. Try: kubectl get fm -A; curl http://localhost/v1/models"
