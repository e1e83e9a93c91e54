#!/usr/bin/env bash
# Installs the current PyTorch from PyPI into bench/.venv (git-ignored), the second reference of the benchmarks
# besides Debian's python3-torch 1.13 at /usr/bin/python3. Only the benchmarks use it; the tests never do.
# Idempotent: an existing venv with torch is kept. Prints the venv's python.
# Usage: bench/torch_venv.sh      env: TORCH_SPEC (default "torch": the newest release)
set -euo pipefail
cd "$(dirname "$0")"
venv=$PWD/.venv
if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  command -v python3 >/dev/null
  python3 -m venv "$venv" >&2 || { echo "bench/torch_venv.sh: python3 -m venv failed (apt-get install python3-venv)" >&2; exit 1; }
  "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
  "$venv/bin/python" -m pip install --quiet "${TORCH_SPEC:-torch}" numpy >&2
fi
echo "$venv/bin/python"
