#!/usr/bin/env bash
# Puts llama.cpp's gguf-py (and numpy) at ${XDG_CACHE_HOME:-~/.cache}/fleet/gguf-py-<version>/
# and prints that folder, for PYTHONPATH; exits at once when it is there. Hash-pinned in
# gguf-py.txt, installed without dependencies (tqdm, PyYAML and requests come from the test venv).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pins="$here/gguf-py.txt"
python=${PYTHON:-python3}
version=$(sed -n 's/^gguf==\([^ ]*\) .*/\1/p' "$pins")
[[ -n $version ]] || { echo "no gguf==VERSION line in $pins" >&2; exit 1; }
target="${XDG_CACHE_HOME:-$HOME/.cache}/fleet/gguf-py-$version"
if [[ -d $target/gguf ]]; then echo "$target"; exit 0; fi

mkdir -p "$(dirname "$target")"
exec 9>"$target.lock"
flock 9
if [[ -d $target/gguf ]]; then echo "$target"; exit 0; fi
staging="$target.partial"
rm -rf "$staging"
"$python" -m pip install --quiet --no-deps --require-hashes --target "$staging" -r "$pins" >&2
mv "$staging" "$target"    # appears whole or not at all
echo "$target"
