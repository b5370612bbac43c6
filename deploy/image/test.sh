#!/usr/bin/env bash
# make image-test: load build/fleet-images-<version>.tar into a fresh podman store and run each
# image as Kubernetes runs it (read-only root filesystem without even a /tmp tmpfs, uid 65532,
# every capability dropped, no privilege escalation):
#   - every console script of the image's fleet packages answers --help;
#   - fleet-core: `fleet-gateway --demo` answers health, models, a chat completion and metrics;
#   - fleet-serving: `python -m fleet_serving.crd` prints exactly deploy/base/crd.yaml;
#   - both images carry LICENSE and NOTICE, and default to uid 65532.
set -euo pipefail
source "$(dirname "$0")/common.sh"
need podman runc
[[ -s $archive ]] || { echo "image-test: no ${archive#"$root/"}: run make image first" >&2; exit 1; }
fresh=$(mktemp -d)
podman=(podman --root "$fresh/root" --runroot "$fresh/run" --storage-driver overlay)
cleanup() {
    "${podman[@]}" rm -af -t 0 >/dev/null 2>&1 || true
    "${podman[@]}" rmi -af >/dev/null 2>&1 || true
    rm -rf "$fresh"
}
trap cleanup EXIT
started=$SECONDS
"${podman[@]}" load -q -i "$archive" >/dev/null
as_kubernetes=(run --rm --read-only --read-only-tmpfs=false --user 65532:65532 --cap-drop=ALL
    --security-opt no-new-privileges --network none)
failures=0
passes=0
check() {  # check WHAT COMMAND...: runs it, reports, counts a failure instead of stopping
    local what=$1; shift
    if output=$("$@" 2>&1); then
        echo "ok   $what"
        passes=$((passes + 1))
    else
        echo "FAIL $what"; echo "$output" | tail -5 | sed 's/^/     /'
        failures=$((failures + 1))
    fi
}
scripts_of() {
    "${podman[@]}" "${as_kubernetes[@]}" "$1" python -c 'import importlib.metadata as m
print(*sorted(e.name for d in m.distributions() if d.metadata["Name"].startswith("fleet")
              for e in d.entry_points if e.group == "console_scripts"))'
}
for image in "$core_image" "$serving_image"; do
    check "$image runs as uid 65532 by default" \
        test "$("${podman[@]}" image inspect --format '{{.Config.User}}' "$image")" = 65532:65532
    check "$image names its user (kopf and torch ask getpass.getuser())" \
        "${podman[@]}" "${as_kubernetes[@]}" "$image" python3 -c 'import getpass; getpass.getuser()'
    check "$image carries LICENSE and NOTICE" "${podman[@]}" "${as_kubernetes[@]}" "$image" \
        test -s /usr/share/doc/fleet/LICENSE -a -s /usr/share/doc/fleet/NOTICE
    scripts=$(scripts_of "$image")
    [[ -n $scripts ]] || { echo "FAIL $image lists no console scripts"; failures=$((failures + 1)); }
    for script in $scripts; do
        check "$image: $script --help" "${podman[@]}" "${as_kubernetes[@]}" "$image" "$script" --help
    done
done

check "fleet-serving: python -m fleet_serving.crd == deploy/base/crd.yaml" \
    diff <("${podman[@]}" "${as_kubernetes[@]}" "$serving_image" python -m fleet_serving.crd) \
    "$root/deploy/base/crd.yaml"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
demo=$("${podman[@]}" run -d --read-only --read-only-tmpfs=false --user 65532:65532 --cap-drop=ALL \
    --security-opt no-new-privileges --network host "$core_image" \
    fleet-gateway --demo --listen "127.0.0.1:$port")
url="http://127.0.0.1:$port"
for _ in $(seq 100); do curl -sf "$url/healthz" >/dev/null && break; sleep 0.2; done
check "fleet-gateway --demo: /healthz" curl -sf "$url/healthz"
check "fleet-gateway --demo: /v1/models lists demo" \
    bash -c "curl -sf '$url/v1/models' | grep -q '\"demo\"'"
check "fleet-gateway --demo: a chat completion" bash -c "curl -sf '$url/v1/chat/completions' \
    -H 'content-type: application/json' \
    -d '{\"model\":\"demo\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}' \
    | grep -q '\"choices\"'"
check "fleet-gateway --demo: /metrics counts it" \
    bash -c "curl -sf '$url/metrics' | grep -q '^fleet_requests_total{.*model=\"demo\"'"
"${podman[@]}" logs "$demo" 2>&1 | tail -3 | sed 's/^/     gateway: /'
"${podman[@]}" rm -f -t 2 "$demo" >/dev/null

echo "image-test ($((SECONDS - started)) s):"
echo "$passes passed, $failures failed"
[[ $failures -eq 0 ]]
