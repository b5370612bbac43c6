#!/usr/bin/env bash
# Install Fleet on a cluster whose nodes already hold its images: the Secrets deploy/ ships no
# default for, the overlay, the services' credentials and the cluster's binding. Any cluster;
# k3s-bootstrap.sh runs it after installing k3s, the e2e tests on their test node.
#
# Usage:  FLEET_OVERLAY=deploy/overlays/k3s FLEET_CLUSTER_ID=k3s FLEET_POD_CIDR=10.42.0.0/16 \
#           deploy/install.sh
#
#   FLEET_OVERLAY          the kustomize overlay to apply (required)
#   FLEET_CLUSTER_ID       this cluster's id: the operator's --cluster, its credential's scope and
#                          its engine key's input (required)
#   FLEET_POD_CIDR         the cluster's pod network: the endpoint addresses it is bound to (required)
#   FLEET_MODELS_NAMESPACE where FleetModels go (default: fleet-models, which deploy/base ships):
#                          labelled for the NetworkPolicy, given the cluster's engine key and the
#                          engine credential. The operator may write only where the overlay binds
#                          its role and passes --namespace, so another namespace must be in the
#                          overlay first (deploy/README.md, "Another models namespace"): without
#                          that, install.sh refuses before changing anything
#   KUBECTL                the kubectl command (default: kubectl; k3s-bootstrap: k3s kubectl)
#   FLEET_APISERVER_URL    the control plane as this machine reaches it; unset, a port-forward;
#                          `clusterip`: its Service's address (from a node)
#   FLEET_GATEWAY_HOST, FLEET_TLS_ISSUER   the ingress's certificate (gateway-tls.sh), made when
#                          the overlay's Ingress names the Secret fleet-gateway-tls (overlays/k3s)
#
# Every Secret is created only when missing, from stdin (never argv, where `ps` would show it):
#   1. fleet-system/fleet-admin-token (random); without fleet-system/fleet-core, one holding a
#      random gateway API key (printed once) so the gateway serves closed, never anonymously;
#      the engine keys (ADR 0010, 0020): fleet-engine-key holds the fleet engine secret in
#      fleet-system (mounted by the gateway) and the cluster's key, HMAC-SHA256 of the cluster id
#      under that secret, in the models' namespace (read by the engines); the ingress's
#      self-signed certificate, fleet-gateway-tls, when the overlay serves HTTPS (gateway-tls.sh);
#   2. applies the overlay and waits for the control plane;
#   3. issues the operator (this cluster), gateway, metrics and engine credentials through its
#      API and stores each in its Secret (again when the control plane no longer knows the one
#      stored: run install.sh again after giving it a database); binds the cluster to its pod
#      network and no model yet (an admin binds each served model name: printed at the end);
#   4. restarts the gateway and the operator, which read their Secrets at start, and waits.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
overlay="${FLEET_OVERLAY:?set FLEET_OVERLAY to the overlay to apply, e.g. deploy/overlays/k3s}"
cluster="${FLEET_CLUSTER_ID:?set FLEET_CLUSTER_ID to the id of this cluster, e.g. k3s}"
pods="${FLEET_POD_CIDR:?set FLEET_POD_CIDR to the pod network of the cluster, e.g. 10.42.0.0/16}"
models="${FLEET_MODELS_NAMESPACE:-fleet-models}"
read -r -a kubectl <<<"${KUBECTL:-kubectl}"

say() { echo "install: $*" >&2; }
k() { "${kubectl[@]}" "$@"; }
random() { openssl rand -hex 32; }
missing() { ! k -n "$1" get secret "$2" >/dev/null 2>&1; }
store() { k -n "$1" create secret generic "$2" --from-file="${3:-token}"=/dev/stdin >/dev/null; }

# 0. The models namespace must be one the overlay lets the operator write to and watch: a
# RoleBinding of fleet-serving-models there, and --namespace=<it> on the operator.
bound_and_watched() {
  k kustomize "$overlay" | awk -v ns="$1" '
    function end_doc() { if (binding && here && role) bound = 1; binding = here = role = 0 }
    /^---$/ { end_doc(); next }
    $0 == "kind: RoleBinding" { binding = 1 }
    $0 == "  namespace: " ns { here = 1 }
    $0 == "  name: fleet-serving-models" { role = 1 }
    $0 ~ ("^ *- --namespace=" ns "$") { watched = 1 }
    END { end_doc(); exit !(bound && watched) }'
}
if ! bound_and_watched "$models"; then
  say "FLEET_MODELS_NAMESPACE=$models: $overlay does not bind the operator there and pass" \
    "--namespace=$models; add both in an overlay (deploy/README.md, Another models namespace)"
  exit 1
fi

# 1. Secrets deploy/ ships no default for.
k apply -f "$here/base/namespace.yaml" >/dev/null
k get namespace "$models" >/dev/null 2>&1 || k create namespace "$models" >/dev/null
k label --overwrite namespace "$models" serving.fleet.dev/models=true >/dev/null
if missing fleet-system fleet-admin-token; then random | store fleet-system fleet-admin-token; fi
engine_secret="$(k -n fleet-system get secret fleet-engine-key -o jsonpath='{.data.api-key}' \
  2>/dev/null | base64 -d || true)"
engine_secret="${engine_secret:-$(random)}"
cluster_key() {  # fleet_core.shared.engine_keys: HMAC-SHA256(fleet secret on stdin, cluster id)
  python3 -c 'import hashlib, hmac, sys
print(hmac.new(sys.stdin.read().encode(), sys.argv[1].encode(), hashlib.sha256).hexdigest(), end="")' "$1"
}
if missing fleet-system fleet-engine-key; then
  printf '%s' "$engine_secret" | store fleet-system fleet-engine-key api-key
fi
if missing "$models" fleet-engine-key; then
  printf '%s' "$engine_secret" | cluster_key "$cluster" | store "$models" fleet-engine-key api-key
fi
unset engine_secret
if k kustomize "$overlay" | grep -Eq '^ *(- )?secretName: fleet-gateway-tls$'; then
  KUBECTL="${KUBECTL:-kubectl}" "$here/gateway-tls.sh"
fi
if missing fleet-system fleet-core; then
  key="demo/default/$(random)"
  printf 'FLEET_API_KEYS=%s\n' "$key" | k -n fleet-system create secret generic fleet-core \
    --from-env-file=/dev/stdin >/dev/null
  say "the gateway's API key (shown once): $key"
fi

# 2. The overlay.
say "applying $overlay"
k apply -k "$overlay" >/dev/null
k wait --for=condition=Established crd/fleetmodels.serving.fleet.dev --timeout=60s >/dev/null
k -n fleet-system rollout status deployment/fleet-apiserver --timeout=300s >/dev/null

# 3. Credentials, issued by the control plane itself with the admin token.
api="${FLEET_APISERVER_URL:-}"
if [[ $api == clusterip ]]; then
  api="http://$(k -n fleet-system get svc fleet-apiserver -o jsonpath='{.spec.clusterIP}'):8081"
elif [[ -z $api ]]; then  # a port-forward, which a NetworkPolicy does not stop
  k -n fleet-system port-forward svc/fleet-apiserver 18081:8081 >/dev/null 2>&1 &
  forward=$!
  trap 'kill "$forward" 2>/dev/null || true' EXIT
  api=http://127.0.0.1:18081
fi
admin="$(k -n fleet-system get secret fleet-admin-token -o jsonpath='{.data.token}' | base64 -d)"
for _ in $(seq 100); do curl -sf "$api/healthz" >/dev/null && break; sleep 0.2; done
call() {  # method, path[, body]: the admin's call, its token through a file descriptor
  curl -sf -X "$1" "$api$2" -H @<(printf 'Authorization: Bearer %s\n' "$admin") \
    ${3:+-H "Content-Type: application/json" -d "$3"}
}
known() {  # namespace, secret: whether the control plane accepts the credential stored there
  local token
  token="$(k -n "$1" get secret "$2" -o jsonpath='{.data.token}' | base64 -d)"
  [[ -n $token ]] && curl -sf "$api/api/v1/whoami" \
    -H @<(printf 'Authorization: Bearer %s\n' "$token") >/dev/null
}
issue() {  # role, namespace, secret[, clusterId]: a new credential's secret into the Secret
  if ! missing "$2" "$3" && ! known "$2" "$3"; then  # issued before the control plane had a database
    say "the control plane does not know the credential in $2/$3: issuing a new one"
    k -n "$2" delete secret "$3" >/dev/null
  fi
  if missing "$2" "$3"; then
    call POST /api/v1/credentials \
      "{\"role\": \"$1\", \"label\": \"install\"${4:+, \"clusterId\": \"$4\"}}" \
      | python3 -c 'import json, sys; print(json.load(sys.stdin)["secret"], end="")' \
      | store "$2" "$3"
  fi
}
issue operator fleet-system fleet-operator-token "$cluster"
issue gateway fleet-system fleet-gateway-token
issue metrics fleet-system fleet-metrics-token
issue engine "$models" fleet-engine-token
# What the cluster may serve is the admin's decision (ADR 0020): its pod network, no model yet.
if ! call GET "/api/v1/clusters/$cluster/binding" >/dev/null; then
  call PUT "/api/v1/clusters/$cluster/binding" \
    "{\"servedModels\": [], \"endpoints\": [\"$pods\"]}" >/dev/null
fi

# 4. The services that read their Secrets at start.
for deployment in fleet-gateway fleet-serving; do
  k -n fleet-system rollout restart "deployment/$deployment" >/dev/null
  k -n fleet-system rollout status "deployment/$deployment" --timeout=300s >/dev/null
done
say "done. A FleetModel serves once its served model name is bound to cluster $cluster:"
say "  PUT /api/v1/clusters/$cluster/binding {\"servedModels\": [\"<name>\", …], \"endpoints\": [\"$pods\"]}"
