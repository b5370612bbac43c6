#!/usr/bin/env bash
# Install k3s on this machine and apply Fleet's k3s overlay.
#
# Usage:  make image && sudo deploy/k3s-bootstrap.sh      (from the repository root)
#
# What it does, in order:
#   1. installs k3s (single node; its bundled Traefik serves the gateway over HTTPS on port 443)
#      unless a `k3s` binary is already present; K3S_VERSION pins a release (default: the stable
#      channel). Its kubeconfig, /etc/rancher/k3s/k3s.yaml, holds cluster-admin credentials and
#      is written 0600 (root only): copy it for your user as deploy/README.md says;
#   2. waits until the node is Ready, then imports Fleet's images into k3s's containerd from the
#      archive `make image` wrote (FLEET_IMAGES, default build/fleet-images-<fleet-core
#      version>.tar; on a node of another architecture, its two .oci.tar archives): no registry
#      is needed, and the manifests name exactly those tags;
#   3. runs install.sh for cluster k3s with deploy/overlays/k3s: the Secrets deploy/ ships no
#      default for (docs/security.md), the ingress's self-signed certificate for
#      FLEET_GATEWAY_HOST (default localhost; gateway-tls.sh), the overlay, the operator (cluster k3s), gateway, engine
#      and metrics credentials, and the cluster's binding to its pod network (10.42.0.0/16) and
#      no model yet. A FleetModel serves once the admin binds its served model name.
#
# GPUs: for vLLM models, install the NVIDIA container toolkit before k3s (k3s then registers the
# `nvidia` runtime) and the NVIDIA device plugin + GPU feature discovery afterwards, so nodes
# advertise nvidia.com/gpu and the nvidia.com/gpu.compute.* labels the operator places by.
# Without them, llama.cpp models still run on CPU. GPU FleetModels set `runtimeClassName: nvidia`
# (k3s's default runtime is not the NVIDIA one). It cannot run in a container without systemd.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/../fleet-core/pyproject.toml")
# One archive or several, space-separated (the multi-arch OCI archives make image writes too).
read -ra images <<<"${FLEET_IMAGES:-$here/../build/fleet-images-$version.tar}"

if [[ "$(id -u)" -ne 0 ]]; then
  echo "k3s-bootstrap: run as root (sudo), it installs a system service" >&2
  exit 1
fi

for archive in "${images[@]}"; do
  if [[ ! -s $archive ]]; then
    echo "k3s-bootstrap: no image archive at $archive: run \`make image\` first (or set FLEET_IMAGES)" >&2
    exit 1
  fi
done

if ! command -v k3s >/dev/null 2>&1; then
  echo "k3s-bootstrap: installing k3s ${K3S_VERSION:-(stable)}"
  curl -sfL https://get.k3s.io | INSTALL_K3S_VERSION="${K3S_VERSION:-}" sh -s - \
    --write-kubeconfig-mode 0600  # cluster-admin credentials: root's alone
fi

export KUBECONFIG=/etc/rancher/k3s/k3s.yaml
kubectl="k3s kubectl"

echo "k3s-bootstrap: waiting for the node"
$kubectl wait --for=condition=Ready node --all --timeout=180s

for archive in "${images[@]}"; do
  echo "k3s-bootstrap: importing $archive"
  k3s ctr --namespace k8s.io images import "$archive"
done

KUBECTL="k3s kubectl" FLEET_OVERLAY="$here/overlays/k3s" FLEET_CLUSTER_ID=k3s \
  FLEET_POD_CIDR=10.42.0.0/16 "$here/install.sh"

echo "k3s-bootstrap: done. Try: k3s kubectl get fm -A, and with the certificate to trust:"
echo "  k3s kubectl -n fleet-system get secret fleet-gateway-tls -o jsonpath='{.data.ca\\.crt}' | base64 -d > fleet-gateway.crt"
echo "  curl --cacert fleet-gateway.crt https://${FLEET_GATEWAY_HOST:-localhost}/v1/models -H \"Authorization: Bearer \$KEY\""
echo "k3s-bootstrap: without FLEET_DATABASE_URL the control plane keeps credentials in memory;"
echo "  after it restarts, delete fleet-operator-token, fleet-gateway-token, fleet-metrics-token"
echo "  and fleet-models/fleet-engine-token and run this again (or give it a database)."
