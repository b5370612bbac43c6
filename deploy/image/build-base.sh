#!/usr/bin/env bash
# make image-base: a local Debian bookworm base with python3 and its venv module, built with
# mmdebstrap from Debian's packages, for machines that reach no container registry. Tagged
# localhost/fleet-base:bookworm in Docker when a daemon answers, else in the build store.
set -euo pipefail
source "$(dirname "$0")/common.sh"
need mmdebstrap podman
mkdir -p "$root/build"
rootfs="$root/build/fleet-base-rootfs.tar"
started=$SECONDS
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs"
if have_docker; then
    docker import "$rootfs" "$local_base"
else
    podman "${store_args[@]}" import --quiet "$rootfs" "$local_base" >/dev/null
fi
rm -f "$rootfs"
echo "image-base: $local_base in $((SECONDS - started)) s" >&2
