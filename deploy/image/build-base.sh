#!/usr/bin/env bash
# make image-base: a local Debian bookworm base with python3 and its venv module for each
# architecture in IMAGE_ARCHES, built with mmdebstrap from Debian's packages, for machines that
# reach no container registry. Tagged localhost/fleet-base:bookworm-<arch>, and this machine's
# own also localhost/fleet-base:bookworm, in Docker when a daemon answers, else in the build store.
# The root filesystems are kept in the per-user cache, keyed by what they are made of, and made
# afresh after a week (Debian's security updates): a fresh clone imports them in seconds.
set -euo pipefail
source "$(dirname "$0")/common.sh"
need mmdebstrap podman
emulate_all
suite=bookworm
include=python3,python3-venv,ca-certificates
key=$(echo "$suite minbase $include" | sha256sum | cut -c1-12)
mkdir -p "$cache"
for arch in "${image_arches[@]}"; do
    started=$SECONDS
    rootfs="$cache/fleet-base-$suite-$arch-$key.tar"
    if [[ ! -s $rootfs ]] || [[ -n $(find "$rootfs" -mtime +7) ]]; then
        mmdebstrap --quiet --arch="$arch" --variant=minbase --include="$include" \
            "$suite" "${rootfs%.tar}.part.tar"
        mv "${rootfs%.tar}.part.tar" "$rootfs"
    fi
    if have_docker; then
        docker import --platform "linux/$arch" "$rootfs" "$local_base-$arch" >/dev/null
        [[ $arch != "$host_arch" ]] || docker tag "$local_base-$arch" "$local_base"
    else
        podman "${store_args[@]}" import --quiet --arch "$arch" "$rootfs" "$local_base-$arch" \
            >/dev/null
        [[ $arch != "$host_arch" ]] || podman "${store_args[@]}" tag "$local_base-$arch" "$local_base"
    fi
    echo "image-base: $local_base-$arch in $((SECONDS - started)) s" >&2
done
