# Sourced by the image scripts: names, versions and the container store they share.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
version_of() { sed -n 's/^version = "\(.*\)"$/\1/p' "$root/$1/pyproject.toml"; }
core_version=$(version_of fleet-core)
serving_version=$(version_of fleet-serving)
# The names the manifests in deploy/base use; containerd (k3s) reads "fleet/x" as docker.io/fleet/x.
core_image="docker.io/fleet/fleet-core:$core_version"
serving_image="docker.io/fleet/fleet-serving:$serving_version"
archive="$root/build/fleet-images-$core_version.tar"
local_base="localhost/fleet-base:bookworm"
# buildah/podman keep their images under build/, not in the machine's store.
store="$root/build/containers"
export CONTAINERS_CONF="$root/deploy/image/containers.conf"
store_args=(--root "$store/root" --runroot "$store/run" --storage-driver "${STORAGE_DRIVER:-overlay}")
have_docker() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }
# need TOOL...: stop with one line saying how to install what is missing (Debian's package names).
need() {
    local missing=() tool
    for tool in "$@"; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
    ((${#missing[@]} == 0)) && return 0
    echo "$(basename "$0"): ${missing[*]} not found; install with: apt-get install ${missing[*]}" >&2
    exit 1
}
