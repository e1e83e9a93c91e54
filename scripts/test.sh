#!/usr/bin/env bash
# Set-up (packages, Release build), the whole test suite through ctest, then scripts/sanitize.sh: the CPU unit tests
# under ASan + UBSan and every fuzz target for FUZZ_SECONDS each (SANITIZE=0 skips that part).
# CUDA tests ([cuda], label "cuda") skip with their reason when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
# Without a GPU the CUDA code can only be compiled, to prove it builds: SASS for Ampere (sm_80) and Hopper (sm_90, with
# PTX) covers every architecture-dependent path, and halves nvcc's share of the build against the default four.
if [ -z "${GPUTRAIN_CMAKE_ARGS:-}" ] && ! nvidia-smi -L >/dev/null 2>&1; then
  export GPUTRAIN_CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=80-real;90"
fi
start=$SECONDS
scripts/setup.sh
echo "test: set-up and build took $((SECONDS - start)) s"
start=$SECONDS
(cd build && ctest --output-on-failure -j "$(nproc)" "$@")
echo "test: ctest took $((SECONDS - start)) s"
start=$SECONDS
[ "${SANITIZE:-1}" = 0 ] || scripts/sanitize.sh
echo "test: sanitizers and fuzzing took $((SECONDS - start)) s"
