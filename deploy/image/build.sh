#!/usr/bin/env bash
# make image: fleet-core and fleet-serving from deploy/image/Dockerfile for every architecture in
# IMAGE_ARCHES (default amd64 arm64; the foreign one built under qemu-user, see common.sh), saved
# as one multi-arch OCI archive per image, build/fleet-<image>-<version>.oci.tar (an image index:
# `ctr images import` picks the node's platform, `skopeo copy --all` pushes both), and this
# machine's architecture also as build/fleet-images-<version>.tar (`docker load`, `k3s ctr images
# import` and `podman load` accept it). buildah builds, or Docker when a daemon answers and only
# this machine's architecture is asked for. IMAGE_BASE overrides the Dockerfile's BASE: a
# multi-arch image, or localhost/fleet-base:bookworm, whose per-architecture tags make image-base
# writes; CA_BUNDLE (default: PIP_CERT or SSL_CERT_FILE when set) is handed to pip as the build
# secret `cacert`.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
mkdir -p build
cert=${CA_BUNDLE:-${PIP_CERT:-${SSL_CERT_FILE:-}}}
args=(-f deploy/image/Dockerfile)
[[ -n $cert && -s $cert ]] && args+=(--secret "id=cacert,src=$cert")
base_for() {  # base_for ARCH: the BASE build argument for ARCH, if any
    if [[ ${IMAGE_BASE:-} == "$local_base" ]]; then
        echo "--build-arg=BASE=$local_base-$1"
    elif [[ -n ${IMAGE_BASE:-} ]]; then
        echo "--build-arg=BASE=$IMAGE_BASE"
    fi
}
started=$SECONDS
if have_docker && [[ ${image_arches[*]} == "$host_arch" ]]; then
    export DOCKER_BUILDKIT=1
    read -ra base < <(base_for "$host_arch") || true
    docker build "${args[@]}" "${base[@]}" --target fleet-core \
        --build-arg "VERSION=$core_version" -t "$core_image" .
    docker build "${args[@]}" "${base[@]}" --target fleet-serving \
        --build-arg "VERSION=$serving_version" -t "$serving_image" .
    docker save -o "$archive" "$core_image" "$serving_image"
    echo "image: $core_image $serving_image -> ${archive#"$root/"} in $((SECONDS - started)) s" >&2
    exit 0
fi
need buildah runc podman
emulate_all
buildah=(buildah "${store_args[@]}" bud --isolation chroot --layers)
[[ -n ${IMAGE_BASE:-} ]] && buildah+=(--pull-never)
podman=(podman "${store_args[@]}")
lists=("localhost/fleet-core:$core_version" "localhost/fleet-serving:$serving_version")
for list in "${lists[@]}"; do
    "${podman[@]}" manifest rm "$list" >/dev/null 2>&1 || true
    "${podman[@]}" manifest create "$list" >/dev/null
done
for arch in "${image_arches[@]}"; do
    read -ra base < <(base_for "$arch") || true
    built=$SECONDS
    for target in fleet-core fleet-serving; do
        tag=${image_tags[$target]} version=${image_versions[$target]}
        "${buildah[@]}" "${args[@]}" "${base[@]}" --platform "linux/$arch" --target "$target" \
            --build-arg "VERSION=$version" -t "$tag-$arch" .
        "${podman[@]}" manifest add "localhost/$target:$version" \
            "containers-storage:$tag-$arch" >/dev/null
        [[ $arch != "$host_arch" ]] || "${podman[@]}" tag "$tag-$arch" "$tag"
    done
    echo "image: linux/$arch built in $((SECONDS - built)) s" >&2
done
saved=("$archive")
if [[ " ${image_arches[*]} " == *" $host_arch "* ]]; then
    rm -f "$archive"
    "${podman[@]}" save --quiet --format docker-archive -m -o "$archive" \
        "$core_image" "$serving_image"
else
    saved=()
fi
for target in fleet-core fleet-serving; do
    tag=${image_tags[$target]} version=${image_versions[$target]}
    out=$(oci_archive "$target")
    rm -f "$out"
    "${podman[@]}" manifest push --quiet --all "localhost/$target:$version" "oci-archive:$out:$tag"
    saved+=("$out")
done
echo "image: ${image_arches[*]} -> ${saved[*]#"$root/"} in $((SECONDS - started)) s" >&2
