#!/usr/bin/env bash
# Installs the current PyTorch from PyPI into bench/.venv (git-ignored), the second reference of the benchmarks
# besides Debian's python3-torch 1.13 at /usr/bin/python3, and Hugging Face `tokenizers` and tiktoken, the references
# of the tokenizer benchmark and fixtures (bench/tokenizer_speed.py, bench/make_bpe_fixtures.py). Only the benchmarks
# use it; the tests never do. Idempotent: what the venv already has is kept. Prints the venv's python.
# Usage: bench/torch_venv.sh [--tokenizers]     --tokenizers: only tokenizers and tiktoken (no torch)
#        env: TORCH_SPEC (default "torch": the newest release)
set -euo pipefail
cd "$(dirname "$0")"
venv=$PWD/.venv
want_torch=1
[[ ${1:-} == --tokenizers ]] && want_torch=0
if [[ ! -x $venv/bin/python ]]; then
  command -v python3 >/dev/null
  python3 -m venv "$venv" >&2 || { echo "bench/torch_venv.sh: python3 -m venv failed (apt-get install python3-venv)" >&2; exit 1; }
  "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
fi
if ((want_torch)) && ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  "$venv/bin/python" -m pip install --quiet "${TORCH_SPEC:-torch}" numpy >&2
fi
if ! "$venv/bin/python" -c 'import tokenizers, tiktoken' 2>/dev/null; then
  "$venv/bin/python" -m pip install --quiet tokenizers tiktoken >&2
fi
echo "$venv/bin/python"
