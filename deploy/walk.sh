#!/usr/bin/env bash
# deploy/README.md's walk, "From a fresh k3s node with a GPU to a chat completion", as a script:
# each numbered step of the README is the function of the same number here, so the walk cannot
# break without this failing. The e2e tests run it on their test node (every step that needs
# neither a GPU nor k3s itself); on a k3s node with a GPU it runs whole.
#
# Usage:  FLEET_WALK_STEPS="2 4 5 6 7" FLEET_WALK_GGUF=gemma-3-270m-q4_k_m.gguf deploy/walk.sh
#
#   FLEET_WALK_STEPS       which steps (default: 1 2 3 4 5 6 7)
#   FLEET_WALK_INSTALL     step 2's command (default: deploy/k3s-bootstrap.sh; the test node
#                          runs deploy/install.sh, its images already imported)
#   FLEET_WALK_GGUF        step 5: the GGUF file to import (Gemma 3 270M in the README)
#   FLEET_WALK_MODEL       its registry id and served model name (default: gemma-3-270m)
#   FLEET_WALK_GPUS        step 6: gpusPerReplica (default 1; 0 runs llama.cpp on the CPU and
#                          drops runtimeClassName)
#   FLEET_MODELS_NAMESPACE step 6: the FleetModel's namespace (default fleet-models, as install.sh)
#   FLEET_WALK_GATEWAY     step 7: the gateway's URL from this machine (default
#                          https://localhost, k3s's Traefik, trusting the certificate in
#                          fleet-gateway-tls; `clusterip`: its Service's address, from a node)
#   FLEET_CLUSTER_ID, FLEET_POD_CIDR   the cluster's id and pod network (default k3s, 10.42.0.0/16)
#   FLEET_DATABASE_URL, FLEET_REDIS_URL   step 4: the control plane's Postgres and the gateways'
#                          Redis, as pods reach them (required for step 4)
#   FLEET_OVERLAY          step 4 runs install.sh again with it (default deploy/overlays/k3s)
#   FLEET_APISERVER_URL    the control plane from this machine; unset, a port-forward;
#                          `clusterip`: its Service's address, from a node
#   KUBECTL, FLEET_CLI     the kubectl and fleet commands (default: kubectl, fleet)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
steps="${FLEET_WALK_STEPS:-1 2 3 4 5 6 7}"
model="${FLEET_WALK_MODEL:-gemma-3-270m}"
gpus="${FLEET_WALK_GPUS:-1}"
gateway="${FLEET_WALK_GATEWAY:-https://localhost}"
export FLEET_CLUSTER_ID="${FLEET_CLUSTER_ID:-k3s}" FLEET_POD_CIDR="${FLEET_POD_CIDR:-10.42.0.0/16}"
read -r -a kubectl <<<"${KUBECTL:-kubectl}"
read -r -a fleet <<<"${FLEET_CLI:-fleet}"

say() { echo "walk: $*" >&2; }
k() { "${kubectl[@]}" "$@"; }
forward=""
API="${FLEET_APISERVER_URL:-}"
cluster_ip() {  # service, port: its ClusterIP URL
  echo "http://$(k -n fleet-system get svc "$1" -o jsonpath='{.spec.clusterIP}'):$2"
}
open_api() {  # the control plane from this machine: FLEET_APISERVER_URL, else a port-forward
  if [[ ${FLEET_APISERVER_URL:-} == clusterip ]]; then API="$(cluster_ip fleet-apiserver 8081)"; fi
  if [[ -n ${FLEET_APISERVER_URL:-} ]]; then return; fi
  if [[ -n $forward ]] && curl -sf "$API/healthz" >/dev/null; then return; fi
  close_api
  k -n fleet-system port-forward svc/fleet-apiserver 18082:8081 >/dev/null 2>&1 &
  forward=$!
  API=http://127.0.0.1:18082
  for _ in $(seq 100); do curl -sf "$API/healthz" >/dev/null && return; sleep 0.2; done
  say "the control plane does not answer through the port-forward"
  return 1
}
close_api() {  # a port-forward follows one pod: closed when the control plane restarts
  if [[ -n $forward ]]; then kill "$forward" 2>/dev/null || true; fi
  forward=""
}
trap 'close_api; rm -f "${gateway_ca:-}"' EXIT
admin_token() { k -n fleet-system get secret fleet-admin-token -o jsonpath='{.data.token}' | base64 -d; }
call() {  # method, path[, body]: the admin's call, its token through a file descriptor
  curl -sf -X "$1" "$API$2" -H @<(printf 'Authorization: Bearer %s\n' "$(admin_token)") \
    ${3:+-H "Content-Type: application/json" -d "$3"}
}

step1() {  # NVIDIA container toolkit, before k3s
  command -v nvidia-container-runtime >/dev/null \
    || { say "1: install nvidia-container-toolkit first (README step 1)"; return 1; }
}

step2() {  # images and k3s (or, on a cluster that has them, the install alone)
  ${FLEET_WALK_INSTALL:-"$here/k3s-bootstrap.sh"}
}

step3() {  # the GPU in Kubernetes: the runtime class, the device plugin (k3s's Helm controller)
  k apply -f - <<'YAML' >/dev/null
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: nvidia}
handler: nvidia
YAML
  k apply -f "$here/gpu/nvidia-device-plugin.yaml" >/dev/null
  local gpus_on_node
  for _ in $(seq 60); do
    gpus_on_node="$(k get node -o jsonpath='{.items[0].status.allocatable.nvidia\.com/gpu}')"
    [[ ${gpus_on_node:-0} -ge 1 ]] && return 0
    sleep 5
  done
  say "3: the node advertises no nvidia.com/gpu after 5 minutes"
  return 1
}

step4() {  # a database for the control plane (and Redis for the gateways)
  : "${FLEET_DATABASE_URL:?step 4 needs FLEET_DATABASE_URL}" "${FLEET_REDIS_URL:?step 4 needs FLEET_REDIS_URL}"
  close_api
  k -n fleet-system delete secret fleet-core --ignore-not-found >/dev/null
  printf 'FLEET_DATABASE_URL=%s\nFLEET_REDIS_URL=%s\n' "$FLEET_DATABASE_URL" "$FLEET_REDIS_URL" \
    | k -n fleet-system create secret generic fleet-core --from-env-file=/dev/stdin >/dev/null
  k -n fleet-system rollout restart deployment/fleet-apiserver deployment/fleet-gateway >/dev/null
  k -n fleet-system rollout status deployment/fleet-apiserver --timeout=300s >/dev/null
  # The credentials step 2 issued lived in the control plane's memory: issue them again.
  FLEET_OVERLAY="${FLEET_OVERLAY:-$here/overlays/k3s}" "$here/install.sh"
}

step5() {  # a model into the registry
  : "${FLEET_WALK_GGUF:?step 5 needs FLEET_WALK_GGUF, the GGUF file to import}"
  open_api
  FLEET_TOKEN="$(admin_token)" "${fleet[@]}" --api "$API" models import "$FLEET_WALK_GGUF" \
    --id "$model" >&2
}

step6() {  # the FleetModel (its served name bound to the cluster first: ADR 0020)
  open_api
  call PUT "/api/v1/clusters/$FLEET_CLUSTER_ID/binding" \
    "{\"servedModels\": [\"$model\"], \"endpoints\": [\"$FLEET_POD_CIDR\"]}" >/dev/null
  local runtime="runtimeClassName: nvidia"
  [[ $gpus -gt 0 ]] || runtime=""
  k apply -f - >/dev/null <<YAML
apiVersion: serving.fleet.dev/v1alpha1
kind: FleetModel
metadata: {name: ${model//./-}, namespace: ${FLEET_MODELS_NAMESPACE:-fleet-models}}
spec:
  servedModelName: $model
  source: {registry: $model}
  weightFormat: gguf
  engine: llamacpp
  replicas: 1
  gpusPerReplica: $gpus
  $runtime
YAML
  k -n "${FLEET_MODELS_NAMESPACE:-fleet-models}" wait "fleetmodel/${model//./-}" \
    --for=jsonpath='{.status.phase}'=Ready --timeout=600s >/dev/null
}

gateway_ca=""
trust_gateway() {  # over HTTPS, trust the ingress's certificate (gateway-tls.sh) and no other
  [[ $gateway == https://* ]] || return 0
  gateway_ca="$(mktemp)"
  k -n fleet-system get secret fleet-gateway-tls -o jsonpath='{.data.ca\.crt}' | base64 -d >"$gateway_ca"
}
gw() { curl ${gateway_ca:+--cacert "$gateway_ca"} "$@"; }

step7() {  # a key and a chat completion, then the request in the ledger
  local key answer
  open_api
  if [[ $gateway == clusterip ]]; then gateway="$(cluster_ip fleet-gateway 8080)"; fi
  trust_gateway
  call POST /api/v1/tenants '{"id": "walk", "name": "Walk"}' >/dev/null || true
  call POST /api/v1/projects '{"tenantId": "walk", "name": "default"}' >/dev/null || true
  key="$(call POST /api/v1/keys '{"projectId": "walk/default", "label": "walk"}' \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["secret"], end="")')"
  # The new key and the model's endpoint reach the gateway within seconds: until it lists the
  # model as ready to this key, a request would be 401 or 503.
  for _ in $(seq 60); do
    gw -sf "$gateway/v1/models" -H @<(printf 'Authorization: Bearer %s\n' "$key") \
      | python3 -c 'import json, sys
sys.exit(0 if any(m["id"] == sys.argv[1] and m["ready"] for m in json.load(sys.stdin)["data"]) else 1)' "$model" \
      && break
    sleep 1
  done
  answer="$(gw -sf "$gateway/v1/chat/completions" -H @<(printf 'Authorization: Bearer %s\n' "$key") \
    -H 'content-type: application/json' \
    -d "{\"model\": \"$model\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 8}")"
  python3 -c 'import json, sys; print("walk: 7: the model said:", json.load(sys.stdin)["choices"][0]["message"]["content"], file=sys.stderr)' <<<"$answer"
  for _ in $(seq 60); do
    if call GET '/api/v1/usage?groupBy=project' | python3 -c 'import json, sys
rows = [r for r in json.load(sys.stdin)["data"] if r["key"] == "walk/default"]
sys.exit(0 if rows and rows[0]["requests"] >= 1 else 1)'; then
      say "7: the request is in the ledger"
      return 0
    fi
    sleep 1
  done
  say "7: the request never reached the ledger"
  return 1
}

for step in $steps; do
  say "step $step"
  "step$step"
done
say "done: steps $steps"
