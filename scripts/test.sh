#!/usr/bin/env bash
# Set-up (packages, Release build), then the whole test suite through ctest.
# CUDA tests ([cuda], label "cuda") skip with their reason when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
