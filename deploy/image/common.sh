# Sourced by the image scripts: names, versions and the container store they share.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
version_of() { sed -n 's/^version = "\(.*\)"$/\1/p' "$root/$1/pyproject.toml"; }
core_version=$(version_of fleet-core)
serving_version=$(version_of fleet-serving)
# The names the manifests in deploy/base use; containerd (k3s) reads "fleet/x" as docker.io/fleet/x.
core_image="docker.io/fleet/fleet-core:$core_version"
serving_image="docker.io/fleet/fleet-serving:$serving_version"
archive="$root/build/fleet-images-$core_version.tar"
declare -A image_tags=([fleet-core]=$core_image [fleet-serving]=$serving_image)
declare -A image_versions=([fleet-core]=$core_version [fleet-serving]=$serving_version)
local_base="localhost/fleet-base:bookworm"
# Both images are built for every architecture in IMAGE_ARCHES (Debian's names, which are OCI's
# too); the one this machine runs is also saved to $archive. The others run under qemu-user.
host_arch=$(dpkg --print-architecture 2>/dev/null ||
    uname -m | sed 's/x86_64/amd64/; s/aarch64/arm64/')
read -ra image_arches <<<"${IMAGE_ARCHES:-amd64 arm64}"
emulate_all() { local arch; for arch in "${image_arches[@]}"; do emulate "$arch"; done; }
# One multi-arch OCI archive per image (an image index: `ctr images import`, `skopeo copy`).
oci_archive() { echo "$root/build/$1-${image_versions[$1]}.oci.tar"; }  # oci_archive fleet-core
# The per-user cache the base root filesystems are kept in between clones (make image-base).
cache="${XDG_CACHE_HOME:-$HOME/.cache}/fleet"
# buildah/podman keep their images under build/, not in the machine's store.
store="$root/build/containers"
export CONTAINERS_CONF="$root/deploy/image/containers.conf"
store_args=(--root "$store/root" --runroot "$store/run" --storage-driver "${STORAGE_DRIVER:-overlay}")
have_docker() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }
# need TOOL[:PACKAGE]...: stop with one line saying how to install what is missing (Debian's
# package names; PACKAGE when it is not the tool's own name).
need() {
    local missing=() packages=() tool
    for tool in "$@"; do
        command -v "${tool%%:*}" >/dev/null 2>&1 && continue
        missing+=("${tool%%:*}")
        packages+=("${tool#*:}")
    done
    ((${#missing[@]} == 0)) && return 0
    echo "$(basename "$0"): ${missing[*]} not found; install with: apt-get install ${packages[*]}" >&2
    exit 1
}
# emulate ARCH: lets this machine run ARCH's binaries (a no-op for its own), through Debian's
# qemu-user-static registered with binfmt_misc with the fix-binary flag, so they run in chroots
# and containers too. Idempotent; one line saying what is missing when it cannot (it needs root).
emulate() {
    local arch=$1 qemu say
    [[ $arch == "$host_arch" ]] && return 0
    say="$(basename "$0"):"
    case $arch in
        arm64) qemu=aarch64 ;;
        amd64) qemu=x86_64 ;;
        *) echo "$say no emulation known for $arch (IMAGE_ARCHES: amd64 arm64)" >&2; exit 1 ;;
    esac
    local entry=/proc/sys/fs/binfmt_misc/qemu-$qemu
    registered() { [[ -f $entry ]] && grep -q '^enabled' "$entry" && grep -q '^flags: .*F' "$entry"; }
    registered && return 0
    need "qemu-$qemu-static:qemu-user-static" update-binfmts:binfmt-support
    local why="IMAGE_ARCHES=$host_arch builds this machine's architecture alone"
    if [[ ! -f /proc/sys/fs/binfmt_misc/status ]] &&
        ! mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null; then
        echo "$say cannot mount binfmt_misc to run $arch binaries (needs root); $why" >&2
        exit 1
    fi
    update-binfmts --enable "qemu-$qemu" 2>/dev/null || true
    if ! registered; then
        echo "$say cannot register qemu-$qemu, fix-binary, with binfmt_misc (needs root); $why" >&2
        exit 1
    fi
}
