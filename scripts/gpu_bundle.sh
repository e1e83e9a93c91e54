#!/usr/bin/env bash
# Gathers what scripts/gpu_check.sh needs on a GPU machine into one folder (default gpu_bundle/, git-ignored):
# the gputrain binary and test binary built here, the non-CUDA shared libraries they link (the CUDA ones — cudart,
# cuBLAS(Lt), cuDNN, NCCL — come from the GPU machine's PyTorch packages and /usr/local/cuda), the fault-injection
# shim the tests load, and the Fashion-MNIST files: about 45 MB, under the device tool's 64 MiB. What the checks read
# besides (scripts/gpu_check*.sh, the configs they train, bench/torch_*.py) are tracked files, which travel with the
# repository the bundle sits in; the GPT-2 check (--gpt2) makes its token shards on the GPU machine.
#
#   scripts/gpu_bundle.sh [BUILD_DIR=build] [OUT=gpu_bundle]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-gpu_bundle}
for f in gputrain gputrain_tests; do
  [[ -x $build/$f ]] || { echo "gpu_bundle: $build/$f is missing: build first (cmake --build $build)" >&2; exit 1; }
done
for f in scripts/gpu_check.sh scripts/gpu_check_env.sh scripts/gpu_check_gpt2.sh configs/gpt2_124m.yaml \
         configs/gpt_bytes.yaml configs/fashion_mnist_mlp.yaml configs/fashion_mnist_cnn.yaml \
         configs/fashion_mnist_speedrun.yaml bench/torch_gpt.py bench/torch_amp.py bench/torch_reference.py; do
  [[ -f $f ]] || { echo "gpu_bundle: $f is missing: gpu_check.sh reads it beside the bundle" >&2; exit 1; }
done
rm -rf "$out"
mkdir -p "$out/lib" "$out/data"
cp "$build/gputrain" "$build/gputrain_tests" "$out/"
[[ -f $build/tests/libgt_fault_inject.so ]] && cp "$build/tests/libgt_fault_inject.so" "$out/lib/"
# Every library the binaries resolve here, except the C runtime (the GPU machine has its own) and the CUDA stack.
skip='^(libc|libm|libdl|libpthread|librt|ld-linux.*|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt|libcudnn.*|libnccl|libnvidia.*)\.so'
for bin in "$out/gputrain" "$out/gputrain_tests"; do
  ldd "$bin" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    if [[ ! $name =~ $skip ]]; then cp -L -n "$path" "$out/lib/$name"; fi
  done
done
data=/usr/share/datasets/fashion-mnist
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  cp "$data/$f" "$out/data/"
done
strip --strip-unneeded "$out/gputrain" "$out/gputrain_tests" 2>/dev/null || true
# OpenBLAS alone is 35 MB: the programs and libraries travel as one xz archive (~8 MB) that gpu_check.sh unpacks.
tar -C "$out" -cJf "$out/programs.tar.xz" gputrain gputrain_tests lib
rm -rf "${out:?}/gputrain" "${out:?}/gputrain_tests" "${out:?}/lib"
echo "gpu_bundle: $(du -sh "$out" | cut -f1) in $out (programs.tar.xz and data/)"
