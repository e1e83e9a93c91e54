#!/usr/bin/env bash
# The CPU unit tests under AddressSanitizer + UndefinedBehaviorSanitizer, then every libFuzzer target in fuzz/ for a
# bounded time; any sanitizer report, crash, leak, hang (> 5 s on one input) or allocation over 2 GiB fails.
# One clang build (build-san/) serves both: the library carries ASan/UBSan and the fuzzer's coverage instrumentation.
# Usage: scripts/sanitize.sh        env: FUZZ_SECONDS (per target, default 6), JOBS (default nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
fuzz_seconds=${FUZZ_SECONDS:-6}
jobs=${JOBS:-$(nproc)}

# -O0 (the CPU kernels keep -O1: lib/CMakeLists.txt) halves clang's time against -O1 under the sanitizers; line
# tables are all a sanitizer report needs to name file:line. At -O0 parsing the headers is most of each file's time,
# so a unity build (16 files to a translation unit; files with their own compile options stay alone) halves the
# build again: 16.5 → about 8 CPU-minutes. The Release build stays one file per unit, which is what checks that each
# file includes what it uses.
cmake -S . -B build-san -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DGPUTRAIN_CUDA=OFF \
  -DGPUTRAIN_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O0 -gline-tables-only" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -gline-tables-only"
cmake --build build-san -j "$jobs" --target gputrain_tests fuzzers

# Any report stops the process with a non-zero status.
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=0:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

echo "sanitize: unit tests (ctest -L cpu -LE e2e) under ASan + UBSan"
(cd build-san && ctest --output-on-failure -j "$jobs" -L cpu -LE e2e)

echo "sanitize: fuzzing each target for ${fuzz_seconds} s"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
for target in $(cd fuzz && ls fuzz_*.cpp | sed 's/\.cpp$//'); do
  # Fuzz a copy of the corpus so the committed seeds stay as they are; crash inputs land in $work/<target>-crashes.
  mkdir -p "$work/$target" "$work/$target-crashes"
  cp fuzz/corpus/"$target"/* "$work/$target"/
  if ! (cd "$work" && "$root/build-san/fuzz/$target" -max_total_time="$fuzz_seconds" -timeout=5 \
          -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/$target-crashes/" "$work/$target" \
          >"$work/$target.log" 2>&1); then
    failed+=("$target")
    tail -n 60 "$work/$target.log"
    mkdir -p build-san/fuzz-crashes
    cp "$work/$target-crashes"/* build-san/fuzz-crashes/ 2>/dev/null || true
    echo "sanitize: $target FAILED; the input is in build-san/fuzz-crashes/ (reproduce: build-san/fuzz/$target FILE)"
  else
    grep -E "stat::number_of_executed_units|cov:" "$work/$target.log" | tail -n 2 | tr '\n' ' '
    echo "← $target"
  fi
done
if ((${#failed[@]})); then
  echo "sanitize: fuzz targets failed: ${failed[*]}"
  exit 1
fi
echo "sanitize: unit tests and fuzzers clean"
