#!/usr/bin/env bash
# make image: fleet-core and fleet-serving from deploy/image/Dockerfile, saved together to
# build/fleet-images-<version>.tar (`docker load`, `k3s ctr images import` and `podman load`
# accept it). Docker when a daemon answers, else buildah. IMAGE_BASE overrides the Dockerfile's
# BASE (make image-base builds localhost/fleet-base:bookworm); CA_BUNDLE (default: PIP_CERT or
# SSL_CERT_FILE when set) is handed to pip as the build secret `cacert`.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
mkdir -p build
cert=${CA_BUNDLE:-${PIP_CERT:-${SSL_CERT_FILE:-}}}
args=(-f deploy/image/Dockerfile)
[[ -n ${IMAGE_BASE:-} ]] && args+=(--build-arg "BASE=$IMAGE_BASE")
[[ -n $cert && -s $cert ]] && args+=(--secret "id=cacert,src=$cert")
started=$SECONDS
if have_docker; then
    export DOCKER_BUILDKIT=1
    docker build "${args[@]}" --target fleet-core --build-arg "VERSION=$core_version" \
        -t "$core_image" .
    docker build "${args[@]}" --target fleet-serving --build-arg "VERSION=$serving_version" \
        -t "$serving_image" .
    docker save -o "$archive" "$core_image" "$serving_image"
else
    need buildah runc
    buildah=(buildah "${store_args[@]}" bud --isolation chroot --layers --pull-never)
    [[ -n ${IMAGE_BASE:-} ]] || buildah=(buildah "${store_args[@]}" bud --isolation chroot --layers)
    "${buildah[@]}" "${args[@]}" --target fleet-core --build-arg "VERSION=$core_version" \
        -t "$core_image" .
    "${buildah[@]}" "${args[@]}" --target fleet-serving --build-arg "VERSION=$serving_version" \
        -t "$serving_image" .
    rm -f "$archive"
    podman "${store_args[@]}" save --quiet --format docker-archive -m -o "$archive" \
        "$core_image" "$serving_image"
fi
echo "image: $core_image $serving_image -> ${archive#"$root/"} in $((SECONDS - started)) s" >&2
