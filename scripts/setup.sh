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
  libopenmpi-dev openmpi-bin
  dataset-fashion-mnist
  fortunes  # English text for configs/gpt_bytes.yaml (/usr/share/games/fortunes)
  python3-torch python3-numpy python3-yaml
  python3-pil  # fuzz/make_corpus.py's JPEG seeds; bench/image_decode.py's PyTorch + PIL reference
  python3-jsonschema  # tests/config_schema_test.py validates configs against `gputrain config schema`
  chromium  # tests/test_report.cpp renders report.html headless
  jq  # the README's shell-loop sweep collects summary.json with it
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

build_type=${GPUTRAIN_BUILD_TYPE:-Release}
cmake -S . -B build -DCMAKE_BUILD_TYPE="$build_type" ${GPUTRAIN_CMAKE_ARGS:-}
cmake --build build -j "$(nproc)"
