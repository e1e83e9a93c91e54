#!/usr/bin/env bash
# Set-up (packages, Release build), the whole test suite through ctest, then scripts/sanitize.sh: the CPU unit tests
# under ASan + UBSan and every fuzz target for FUZZ_SECONDS each (SANITIZE=0 skips that part).
# CUDA tests ([cuda], label "cuda") skip with their reason when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
(cd build && ctest --output-on-failure -j "$(nproc)" "$@")
[ "${SANITIZE:-1}" = 0 ] || scripts/sanitize.sh
