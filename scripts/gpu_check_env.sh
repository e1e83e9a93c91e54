# shellcheck shell=bash
# What scripts/gpu_check.sh and scripts/gpu_check_gpt2.sh share, sourced by both from the repository root with
# `bundle` (the folder scripts/gpu_bundle.sh made) and `dry` (1: the dry run on this machine's CPU) set: the bundle
# unpacked into $work (removed on exit), the Python that has PyTorch ($py), the library path, the binaries ($gt,
# $tests), and the functions show_devices, random_shards and cuda_tests.
: "${bundle:?the sourcing script sets bundle}" "${dry:?the sourcing script sets dry}"
[[ -f $bundle/programs.tar.xz ]] || { echo "gpu_check: no $bundle/programs.tar.xz: run scripts/gpu_bundle.sh first" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xJf "$bundle/programs.tar.xz"
py=python3
[[ -x /usr/bin/python3 && $dry == 1 ]] && py=/usr/bin/python3  # Debian's, with python3-torch, here

# The CUDA libraries: PyTorch's nvidia-* wheels first (cuDNN, cuBLAS, NCCL live there on the GPU machines), then
# /usr/local/cuda; the bundle's own libraries (yaml-cpp, spdlog, OpenBLAS, ...) before both.
nv=$($py - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
print(":".join(sorted({os.path.dirname(p) for r in roots for p in glob.glob(os.path.join(r, "*", "lib", "*.so*"))})))
PY
)
export LD_LIBRARY_PATH="$work/lib${nv:+:$nv}:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
gt="$work/gputrain"
tests="$work/gputrain_tests"
export GT_GPUTRAIN="$gt"  # the end-to-end [cuda] tests run this binary, not the path it was built at

# The GPU (nvidia-smi) and gputrain's view of the devices; stops the script when gputrain does not start.
show_devices() {
  echo "== devices"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$gt" devices || { echo "gpu_check: gputrain does not start (missing libraries?)"; ldd "$gt" | grep "not found"; exit 1; }
}

# The GPU's name for the summary lines, or what stands for it in a dry run.
gpu_name() {
  if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name --format=csv,noheader | head -1; else echo "no GPU (dry run)"; fi
}

# random_shards DIR VOCAB TOKENS SEED: DIR/train_000000.bin and DIR/val_000000.bin, llm.c uint16 shards of TOKENS
# uniformly random ids below VOCAB.
random_shards() {
  $py - "$@" <<'PY'
import os, sys, numpy as np
d, vocab, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.makedirs(d, exist_ok=True)
for name in ("train_000000.bin", "val_000000.bin"):
    header = np.zeros(256, dtype="<i4"); header[:3] = (20240520, 1, n)
    with open(os.path.join(d, name), "wb") as f:
        f.write(header.tobytes()); f.write(np.random.default_rng(seed).integers(0, vocab, n).astype("<u2").tobytes())
PY
}

# cuda_tests SPEC SECONDS: every test case of the Catch2 spec (`[cuda]`, `[cuda] *attention*`) as its own process (a
# crash in one cannot hide the others), each stopped after SECONDS; prints its outcome and the `rate:` lines it
# prints, and sets pass, fail, skip and failed (the failed cases' names).
cuda_tests() {
  local spec=$1 seconds=$2 name filter start rc dt
  pass=0 fail=0 skip=0
  failed=()
  while IFS= read -r name; do
    [[ -z $name ]] && continue
    # Catch2 takes a test name as a filter; commas and brackets in names are escaped.
    filter=${name//,/\\,}
    filter=${filter//[/\\[}
    start=$(date +%s.%N)
    timeout "$seconds" "$tests" "$filter" > "$work/t.log" 2>&1
    rc=$?
    dt=$(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN { printf "%.1f", a - b }')  # (the GPU image has no bc)
    case $rc in
      0) pass=$((pass + 1)); printf '  pass  %5.1fs  %s\n' "$dt" "$name"
         grep '^rate: ' "$work/t.log" | sed 's/^/        /' ;;  # a case that times something prints its rate
      77) skip=$((skip + 1)); printf '  skip         %s: %s\n' "$name" "$(grep -m1 SKIPPED "$work/t.log")" ;;
      *)
        fail=$((fail + 1)); failed+=("$name")
        if [[ $rc == 124 ]]; then printf '  FAIL  (timed out after %ss) %s\n' "$seconds" "$name"; else printf '  FAIL  (exit %s) %s\n' "$rc" "$name"; fi
        # The first failed checks with their expansions and messages (a test that trains prints its run's log after
        # them, which a tail alone would show instead), then the end of the output.
        grep -m4 -A14 'FAILED:' "$work/t.log" | head -60 | sed 's/^/        /'
        echo "        ... last lines:"
        tail -12 "$work/t.log" | sed 's/^/        /' ;;
    esac
  done < <(timeout 60 "$tests" "$spec" --list-test-names-only 2>/dev/null | sed 's/^ *//')
}
