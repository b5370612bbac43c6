#!/usr/bin/env bash
# Builds llama.cpp's own `llama-server` (the engine the operator renders for GGUF models) from the
# llama.cpp source vendored in the llama-cpp-python sdist pinned in llama-cpp-python.txt, once per
# version, into ${XDG_CACHE_HOME:-~/.cache}/fleet/llama.cpp-<version>/bin/llama-server.
# Prints the binary's path on stdout; exits at once when it is already cached.
#
# GGML_NATIVE=OFF: a native build uses CPU instructions (AMX) that some VMs refuse (SIGILL on the
# first request). Static, server target only, no web UI download, no OpenSSL: one self-contained
# binary that the e2e harness and `make llama-server` can run from the cache.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pins="$here/llama-cpp-python.txt"
python=${PYTHON:-python3}
version=$(sed -n 's/^llama-cpp-python==\([^ ]*\) .*/\1/p' "$pins")
[[ -n $version ]] || { echo "no llama-cpp-python==VERSION line in $pins" >&2; exit 1; }
cache="${XDG_CACHE_HOME:-$HOME/.cache}/fleet/llama.cpp-$version"
binary="$cache/bin/llama-server"
if [[ -x $binary ]]; then echo "$binary"; exit 0; fi

mkdir -p "$(dirname "$cache")"
exec 9>"$cache.lock"
flock 9    # a second caller waits for the first build instead of racing it
if [[ -x $binary ]]; then echo "$binary"; exit 0; fi

for tool in cmake g++; do
    command -v "$tool" >/dev/null 2>&1 || { echo "$tool not found; install with: apt-get install cmake build-essential" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "building llama-server from llama-cpp-python $version (several minutes)" >&2
started=$SECONDS
"$python" -m pip download --quiet --no-deps --no-binary llama-cpp-python --require-hashes \
    -r "$pins" -d "$work/sdist" >&2
tar -xzf "$work/sdist/llama_cpp_python-$version.tar.gz" -C "$work"
source_dir="$work/llama_cpp_python-$version/vendor/llama.cpp"
cmake -S "$source_dir" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
cmake --build "$work/build" --target llama-server --parallel "$(nproc)" >&2

staging="$cache.partial"
rm -rf "$staging"
mkdir -p "$staging/bin"
install -m 0755 "$work/build/bin/llama-server" "$staging/bin/llama-server"
cp "$source_dir/LICENSE" "$staging/LICENSE"
rm -rf "$cache"
mv "$staging" "$cache"    # the cache entry appears whole or not at all
echo "built $binary in $((SECONDS - started)) s" >&2
echo "$binary"
