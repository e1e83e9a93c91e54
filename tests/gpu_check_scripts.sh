#!/usr/bin/env bash
# The GPU check's scripts on a machine without a GPU, in seconds: each parses (bash -n) and, where ShellCheck is
# installed, passes it; unknown options and part numbers are refused with exit 2 before anything runs; and part 2 of
# `gpu_check_gpt2.sh --dry-run` (a 2-layer GPT's 20 steps twice, their losses compared step by step), run from a
# bundle of this build's gputrain, prints its PASS line with the largest relative difference. Exit 77 (ctest's skip)
# when the Python with numpy that the script uses is missing and nothing else failed.
# Usage: tests/gpu_check_scripts.sh GPUTRAIN_BINARY SOURCE_DIR   (ctest runs it as gpu_check_scripts)
set -uo pipefail
gt=$1
cd "$2" || exit 1
status=0
fail() { echo "gpu_check_scripts: $*"; status=1; }
scripts=(scripts/gpu_check.sh scripts/gpu_check_env.sh scripts/gpu_check_gpt2.sh scripts/gpu_bundle.sh)
for f in "${scripts[@]}"; do bash -n "$f" || fail "$f does not parse"; done
if command -v shellcheck >/dev/null; then
  shellcheck -x "${scripts[@]}" || fail "ShellCheck finds the problems above"
else
  echo "gpu_check_scripts: ShellCheck is not installed: that part is not checked"
fi
refused() {  # expected exit 2, and a line on stderr naming the mistake
  local err rc
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  [[ $rc == 2 && -n $err ]] || fail "$* gave exit $rc (expected 2 with a reason): $err"
}
refused scripts/gpu_check.sh --no-such-option
refused scripts/gpu_check.sh --dry-run --gpt2-part 0
refused scripts/gpu_check_gpt2.sh --part 6
refused scripts/gpu_check_gpt2.sh --part 1,,2

py=python3
[[ -x /usr/bin/python3 ]] && py=/usr/bin/python3  # the one gpu_check_env.sh takes in a dry run
if ! $py -c "import numpy" 2>/dev/null; then
  echo "gpu_check_scripts: SKIPPED: $py has no numpy, which the dry run's token shards need"
  [[ $status == 0 ]] && exit 77
  exit "$status"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bundle" "$tmp/programs/lib"
cp "$gt" "$tmp/programs/gputrain"
tar -C "$tmp/programs" -cf - gputrain lib | xz -0 -T1 > "$tmp/bundle/programs.tar.xz"
out=$(scripts/gpu_check_gpt2.sh --dry-run --part 2 "$tmp/bundle" 2>&1)
rc=$?
line=$(grep '^part 2: ' <<< "$out")
if [[ $rc != 0 || ! $line =~ ^part\ 2:\ PASS:\ cpu\ fp32\ against\ cpu\ bf16,\ 20\ steps,\ max\ relative\ loss\ difference\ [0-9.e+-]+\ at\ step\ [0-9]+ ]]; then
  fail "gpu_check_gpt2.sh --dry-run --part 2 gave exit $rc and no PASS line; its output:"
  echo "$out" | tail -20
fi
[[ $status == 0 ]] && echo "gpu_check_scripts: ok — $line"
exit "$status"
