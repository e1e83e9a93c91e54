#!/usr/bin/env bash
# Installs the Debian packages gputrain needs (only those missing), then configures and builds Release into build/.
# Usage: scripts/setup.sh
# python3-torch (with numpy and yaml) is the reference of the benchmarks in bench/ and of the export round-trip test.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake pkg-config
  universal-ctags  # scripts/check_sizes.sh (ctest source_sizes) finds functions and their lengths with it
  libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev catch2
  libopenblas-dev zlib1g-dev
  libpng-dev libjpeg-dev  # data.format: images decodes PNG (libpng) and JPEG (libjpeg-turbo) folders
  nlohmann-json3-dev  # lib/core/json_read.cpp
  libpcre2-dev libutf8proc-dev  # lib/text/: tokenizer.json's pre-tokenizer patterns (PCRE2) and NFC (utf8proc)
  libsentencepiece-dev  # lib/text/sentencepiece.cpp: subword vocabularies (gputrain tokenize --vocab-size)
  python3-sentencepiece  # tests/test_tokenizers.cpp compares ids with Debian's Python binding
  libopenmpi-dev openmpi-bin
  dataset-fashion-mnist
  fortunes  # English text for configs/gpt_bytes.yaml (/usr/share/games/fortunes)
  python3-torch python3-numpy python3-yaml
  python3-pil  # fuzz/make_corpus.py's JPEG seeds; bench/image_decode.py's PyTorch + PIL reference
  python3-jsonschema  # tests/config_schema_test.py validates configs against `gputrain config schema`
  chromium  # tests/test_report.cpp renders report.html headless
  jq  # docs/sweeps.md's shell loop collects summary.json with it
  slurmd slurmctld slurm-client munge  # tests/slurm_local.sh: srun under a local Slurm
  clang libclang-rt-14-dev libomp-14-dev  # scripts/sanitize.sh: ASan/UBSan, libFuzzer, OpenMP for clang
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# TensorBoard's own event-file reader, for tests/test_tensorboard.cpp (which runs the same interpreter: $GT_PYTHON,
# else the first python3 on PATH). Installed into that interpreter's own site-packages, not with --user: a user
# install is also seen by /usr/bin/python3 of the same version, and its numpy would shadow the one python3-torch needs.
python=${GT_PYTHON:-python3}
if ! "$python" -c 'import tensorboard' 2>/dev/null; then
  echo "setup: installing tensorboard for $("$python" -c 'import sys; print(sys.executable)')"
  "$python" -m pip install --quiet tensorboard
fi

# The cuDNN frontend (header-only C++, NVIDIA's graph API over cuDNN's backend): lib/ops/cuda/attention_cudnn.cpp
# builds cuDNN's fused flash attention with it. Its headers come from the PyPI wheel, pinned, into .cache/ (never into
# git); CMake finds them there (CUDNN_FRONTEND_INCLUDE_DIR). The wheel is chosen for one fixed interpreter and
# platform so that every machine unpacks the same file (the headers are the same in all of them); a present header
# of the pinned version skips the download. Without them the build still succeeds, with the CUDA attention kernels
# only.
frontend_version=1.32.0
frontend_dir=.cache/cudnn-frontend
if ! grep -qs "^$frontend_version\$" "$frontend_dir/VERSION"; then
  echo "setup: fetching the cuDNN frontend $frontend_version headers into $frontend_dir"
  rm -rf "$frontend_dir"
  mkdir -p "$frontend_dir/wheel"
  if "$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
       --abi cp311 --platform manylinux_2_28_x86_64 -d "$frontend_dir/wheel" "nvidia-cudnn-frontend==$frontend_version"; then
    "$python" - "$frontend_dir" <<'PY'
import glob, sys, zipfile
root = sys.argv[1]
(wheel,) = glob.glob(f"{root}/wheel/*.whl")
with zipfile.ZipFile(wheel) as z:
    z.extractall(root, [n for n in z.namelist() if n.startswith("include/")])
PY
    rm -rf "$frontend_dir/wheel"
    if [[ -f $frontend_dir/include/cudnn_frontend.h ]]; then echo "$frontend_version" > "$frontend_dir/VERSION"; fi
  else
    echo "setup: could not download nvidia-cudnn-frontend $frontend_version: CUDA attention keeps its own kernels" >&2
    rm -rf "$frontend_dir"
  fi
fi

build_type=${GPUTRAIN_BUILD_TYPE:-Release}
cmake -S . -B build -DCMAKE_BUILD_TYPE="$build_type" ${GPUTRAIN_CMAKE_ARGS:-}
cmake --build build -j "$(nproc)"
