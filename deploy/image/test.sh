#!/usr/bin/env bash
# make image-test: load what make image wrote into a fresh podman store and run each image as
# Kubernetes runs it (read-only root filesystem without even a /tmp tmpfs, uid 65532, every
# capability dropped, no privilege escalation), for every architecture in IMAGE_ARCHES: this
# machine's from build/fleet-images-<version>.tar, the others from the multi-arch OCI archives,
# run under qemu-user (common.sh):
#   - each OCI archive's index lists exactly the IMAGE_ARCHES platforms;
#   - every console script of the image's fleet packages answers --help;
#   - fleet-core: `fleet-gateway --demo` answers health, models, a chat completion and metrics;
#   - fleet-serving: `python -m fleet_serving.crd` prints exactly deploy/base/crd.yaml;
#   - both images carry LICENSE and NOTICE, and default to uid 65532.
set -euo pipefail
source "$(dirname "$0")/common.sh"
need podman runc
emulate_all
fresh=$(mktemp -d)
podman=(podman --root "$fresh/root" --runroot "$fresh/run" --storage-driver overlay)
cleanup() {
    "${podman[@]}" rm -af -t 0 >/dev/null 2>&1 || true
    "${podman[@]}" rmi -af >/dev/null 2>&1 || true
    rm -rf "$fresh"
}
trap cleanup EXIT
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
run=()  # podman run as Kubernetes runs, for the architecture under test (set per architecture)
scripts_of() {
    "${run[@]}" "$1" python -c 'import importlib.metadata as m
print(*sorted(e.name for d in m.distributions() if d.metadata["Name"].startswith("fleet")
              for e in d.entry_points if e.group == "console_scripts"))'
}
tests() {  # tests ARCH CORE SERVING: every check on one architecture's two images
    local arch=$1 core=$2 serving=$3 image script scripts port demo url
    run=("${podman[@]}" "${as_kubernetes[@]}" --arch "$arch")
    for image in "$core" "$serving"; do
        check "$arch $image is built for linux/$arch" test "$("${podman[@]}" image inspect \
            --format '{{.Os}}/{{.Architecture}}' "$image")" = "linux/$arch"
        check "$arch $image runs $arch binaries" \
            test "$("${run[@]}" "$image" python3 -c 'import platform; print(platform.machine())')" \
            = "$(case $arch in arm64) echo aarch64 ;; amd64) echo x86_64 ;; esac)"
        check "$arch $image runs as uid 65532 by default" \
            test "$("${podman[@]}" image inspect --format '{{.Config.User}}' "$image")" = 65532:65532
        check "$arch $image names its user (kopf and torch ask getpass.getuser())" \
            "${run[@]}" "$image" python3 -c 'import getpass; getpass.getuser()'
        check "$arch $image carries LICENSE and NOTICE" "${run[@]}" "$image" \
            test -s /usr/share/doc/fleet/LICENSE -a -s /usr/share/doc/fleet/NOTICE
        scripts=$(scripts_of "$image")
        [[ -n $scripts ]] || { echo "FAIL $arch $image lists no console scripts"; failures=$((failures + 1)); }
        for script in $scripts; do
            check "$arch $image: $script --help" "${run[@]}" "$image" "$script" --help
        done
    done

    check "$arch fleet-serving: python -m fleet_serving.crd == deploy/base/crd.yaml" \
        diff <("${run[@]}" "$serving" python -m fleet_serving.crd) \
        "$root/deploy/base/crd.yaml"

    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    demo=$("${podman[@]}" run -d --arch "$arch" --read-only --read-only-tmpfs=false --user 65532:65532 --cap-drop=ALL \
        --security-opt no-new-privileges --network host "$core" \
            fleet-gateway --demo --listen "127.0.0.1:$port")
    url="http://127.0.0.1:$port"
    for _ in $(seq 300); do curl -sf "$url/healthz" >/dev/null && break; sleep 0.2; done
    check "$arch fleet-gateway --demo: /healthz" curl -sf "$url/healthz"
    check "$arch fleet-gateway --demo: /v1/models lists demo" \
        bash -c "curl -sf '$url/v1/models' | grep -q '\"demo\"'"
    check "$arch fleet-gateway --demo: a chat completion" bash -c "curl -sf '$url/v1/chat/completions' \
        -H 'content-type: application/json' \
        -d '{\"model\":\"demo\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}' \
        | grep -q '\"choices\"'"
    check "$arch fleet-gateway --demo: /metrics counts it" \
        bash -c "curl -sf '$url/metrics' | grep -q '^fleet_requests_total{.*model=\"demo\"'"
    "${podman[@]}" logs "$demo" 2>&1 | tail -3 | sed 's/^/     gateway: /'
    "${podman[@]}" rm -f -t 2 "$demo" >/dev/null
}

# platforms OCI_ARCHIVE: the linux/<arch> entries of the archive's image index, sorted.
platforms() {
    python3 - "$1" <<'PY'
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as tar:
    def read(name): return json.load(tar.extractfile(name))
    entries = read("index.json")["manifests"]
    while entries and "platform" not in entries[0]:  # an index nested in the layout's index
        entries = read("blobs/sha256/" + entries[0]["digest"].split(":")[1])["manifests"]
    print(*sorted(f"{e['platform']['os']}/{e['platform']['architecture']}" for e in entries))
PY
}

started=$SECONDS
# This machine's architecture alone (Docker's build) is tested from the docker-archive only.
wanted=$(printf 'linux/%s\n' "${image_arches[@]}" | sort | xargs)
for name in fleet-core fleet-serving; do
    [[ $wanted != "linux/$host_arch" ]] || break
    oci=$(oci_archive "$name")
    check "${oci#"$root/"} holds $wanted" test "$(platforms "$oci" 2>&1)" = "$wanted"
done
for arch in "${image_arches[@]}"; do
    core=$core_image serving=$serving_image
    if [[ $arch == "$host_arch" ]]; then
        [[ -s $archive ]] || { echo "image-test: no ${archive#"$root/"}: run make image" >&2; exit 1; }
        "${podman[@]}" load -q -i "$archive" >/dev/null
    else
        core=$core_image-$arch serving=$serving_image-$arch
        for name in fleet-core fleet-serving; do
            oci=$(oci_archive "$name")
            [[ -s $oci ]] || { echo "image-test: no ${oci#"$root/"}: run make image" >&2; exit 1; }
            id=$("${podman[@]}" pull -q --arch "$arch" "oci-archive:$oci" | tail -1)
            "${podman[@]}" tag "$id" "${image_tags[$name]}-$arch"
        done
    fi
    tests "$arch" "$core" "$serving"
done
echo "image-test ($((SECONDS - started)) s):"
echo "$passes passed, $failures failed"
[[ $failures -eq 0 ]]
