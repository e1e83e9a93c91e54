#!/usr/bin/env bash
# GPT-2's GPU check (`scripts/gpu_check.sh --gpt2` runs it), from the bundle of scripts/gpu_bundle.sh, in four parts
# and in this order, under 5 minutes on an H200:
#   1. cuDNN attention against the CPU reference at bf16 tolerance, forward and backward: the [cuda] test cases
#      matching *attention* (tests/test_cuda_attention.cpp and the CUDA kernels' cases), each its own process, with
#      their outcome and the `rate:` lines they print (the attention kernels' TFLOP/s at GPT-2's shape);
#   2. 20 bf16 steps of a 2-layer GPT (configs/gpt_bytes.yaml with its block repeated twice, batch 16 × 64, on tokens
#      of a random Markov chain with four successors per byte, seed 3, which it learns from) on CUDA and on the CPU,
#      both with their activations in bf16 between layers (GPUTRAIN_HALF_ACTIVATIONS=on): every step's loss
#      (metrics.jsonl, log_every 1) within 1 % relative of the CPU's, or the part fails naming the worst step;
#   3. configs/gpt2_124m.yaml on random tokens of GPT-2's vocabulary, micro-batch 16 × 1024 without accumulation, in
#      bf16 with its activations in bf16 between layers (GPUTRAIN_HALF_ACTIVATIONS=on), in bf16 with f32 activations
#      and 16-bit copies for backward (=off), and in tf32: 10 warm-up steps, then 30 timed ones. log_every is 10, so metrics.jsonl's rows at steps 20, 30
#      and 40 hold the training seconds of exactly the timed steps (each row's window ends in a wait for the device);
#      tokens/s is their tokens over those seconds, MFU gputrain's own (its rows' mfu per token/s, i.e. 3 × forward
#      FLOPs over the peak of lib/ops/devices.cpp for the precision), and the peak device memory its rows report;
#   4. the same model, shape and steps in PyTorch (bench/torch_gpt.py, windows preloaded on the GPU): eager tf32 with
#      F.scaled_dot_product_attention(is_causal=True), eager under bf16 autocast, and torch.compile under bf16
#      autocast (compiled during the warm-up steps); tokens/s, torch.cuda.max_memory_allocated, and an MFU of the
#      same count and peak as gputrain's;
# then one table of parts 3 and 4 with the targets beside the figures (gputrain bf16 ≥ 400k tokens/s and ≥ 1.0×
# torch.compile; tf32 ≥ 1.2× eager tf32). Part 5, only when asked for (`--part 5`, about a minute), is where a bf16
# GPT-2 step goes: the built-in profiler (CUDA events) over steps 6–10, its time by layer type and phase and its 15
# largest rows, what to speed up next. Every command has a timeout, so a hang costs minutes, not the window.
# `--part N` runs part N alone, `--part 3,4` several; the table shows the rows of the parts that ran. `--dry-run`
# runs it all here on the CPU (1 × 128, 1 warm-up and 2 timed steps, gputrain's MFU against a nominal 1 TFLOP/s, the
# CPU in fp32 standing in for CUDA in part 2; PyTorch without SDPA or torch.compile shows what it ran instead), so
# the script is proven before device time. Exit status 1 when a test case, part 2 or a gputrain run fails; PyTorch's
# failures and missed targets are shown, not fatal.
#
#   scripts/gpu_check_gpt2.sh [--dry-run] [--part N[,N...]] [BUNDLE=gpu_bundle]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
dry=0
parts=1,2,3,4
while [[ ${1:-} == --* ]]; do
  case $1 in
    --dry-run) dry=1; shift ;;
    --part) parts=${2:?--part needs part numbers, 1 to 5}; shift 2 ;;
    *) echo "gpu_check_gpt2: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $parts =~ ^[1-5](,[1-5])*$ ]] || { echo "gpu_check_gpt2: --part $parts: give 1 to 5, or a list such as 3,4" >&2; exit 2; }
bundle=${1:-gpu_bundle}
# shellcheck source=scripts/gpu_check_env.sh
source scripts/gpu_check_env.sh
status=0
results="$work/results"  # one JSON file per row of the table
mkdir -p "$results"
wants() { [[ ,$parts, == *,$1,* ]]; }

# The shape, steps and time limits: GPT-2's micro-batch on the GPU; on the CPU a window of 128 and three steps.
if [[ $dry == 1 ]]; then
  dev=cpu batch=1 block=128 warmup=1 timed=2 threads=2 shard=1000000
  limit_test=60 limit_small=300 limit_run=600 limit_compile=600
  nominal=(--set +train.peak_tflops=1)  # a nominal 1 TFLOP/s, so that the MFU's arithmetic runs here too
else
  dev=cuda batch=16 block=1024 warmup=10 timed=30 threads=8 shard=4000000
  limit_test=120 limit_small=120 limit_run=180 limit_compile=300
  nominal=()
fi
show_devices

part1() {
  echo "== 1. cuDNN attention against the CPU at bf16 tolerance, forward and backward ([cuda] *attention*)"
  cuda_tests "[cuda] *attention*" "$limit_test"
  echo "part 1: $pass passed, $fail failed, $skip skipped${failed:+ — failed: ${failed[*]}}"
  if ((fail > 0)) || { [[ $dry == 0 ]] && ((pass == 0)); }; then status=1; fi
}

part2() {
  echo "== 2. a 2-layer GPT, 20 bf16 steps on CUDA against the CPU's: every step's loss within 1 % relative"
  $py - "$work/markov" <<'PY'
import os, sys, numpy as np
# Bytes of a Markov chain with four random successors per byte: a loss that falls from ln 256 towards ln 4, so the
# two runs' losses follow a trajectory of the training, not only the loss of uniform guessing.
d, n = sys.argv[1], 200000
rng = np.random.default_rng(3)
succ, pick = rng.integers(0, 256, (256, 4)), rng.integers(0, 4, n)
tok = np.zeros(n, dtype=np.int64)
for i in range(1, n):
    tok[i] = succ[tok[i - 1], pick[i]]
os.makedirs(d, exist_ok=True)
for name in ("train_000000.bin", "val_000000.bin"):
    header = np.zeros(256, dtype="<i4"); header[:3] = (20240520, 1, n)
    with open(os.path.join(d, name), "wb") as f:
        f.write(header.tobytes()); f.write(tok.astype("<u2").tobytes())
PY
  local sets=(--max-steps 20 --quiet --set "data.train.path=$work/markov/train_*.bin"
              --set "data.test.path=$work/markov/val_*.bin" --set 'model.layers[2].repeat=2' --set train.log_every=1
              --set train.eval_every=1000000 --set train.eval_tokens=64 --set scheduler.warmup_steps=0)
  # The dry run has no CUDA: the CPU in fp32 stands in for it, so the comparison meets differences all the same.
  local runs=("$dev:bf16" cpu:bf16)
  [[ $dry == 1 ]] && runs=(cpu:fp32 cpu:bf16)
  local run d p out rc
  for run in "${runs[@]}"; do
    d=${run%%:*} p=${run#*:} out="$work/small-$d-$p"
    GPUTRAIN_HALF_ACTIVATIONS=on timeout "$limit_small" "$gt" train configs/gpt_bytes.yaml --device "$d" \
      --precision "$p" --out "$out" \
      "${sets[@]}" > "$out.log" 2>&1
    rc=$?
    if [[ $rc != 0 ]]; then
      echo "part 2: FAIL: gputrain on $d in $p stopped with exit $rc$([[ $rc == 124 ]] && echo " (timed out)")"
      tail -15 "$out.log" | sed 's/^/        /'
      status=1; return
    fi
  done
  $py - "$work/small-${runs[0]/:/-}/metrics.jsonl" "$work/small-cpu-bf16/metrics.jsonl" "${runs[0]}" <<'PY' || status=1
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if r.get("type") == "train"}
dev, cpu, name = losses(sys.argv[1]), losses(sys.argv[2]), sys.argv[3].replace(":", " ")
steps = sorted(set(dev) & set(cpu))
if len(steps) != 20 or len(dev) != 20 or len(cpu) != 20:
    print(f"part 2: FAIL: 20 steps each expected, rows for {len(dev)} ({name}) and {len(cpu)} (cpu bf16)")
    sys.exit(1)
rel = {s: abs(dev[s] - cpu[s]) / abs(cpu[s]) for s in steps}
worst = max(steps, key=rel.get)
verdict = "PASS" if rel[worst] <= 0.01 else "FAIL"
print(f"part 2: {verdict}: {name} against cpu bf16, 20 steps, max relative loss difference {rel[worst]:.2e} at step "
      f"{worst} ({dev[worst]:.5f} against {cpu[worst]:.5f}; limit 1e-02); losses {cpu[1]:.4f} → {cpu[20]:.4f} on the CPU")
sys.exit(verdict != "PASS")
PY
}

# The GPT-2 runs' data (both parts 3 and 4), made once.
gpt2_data() {
  [[ -f $work/tok2/train_000000.bin ]] || random_shards "$work/tok2" 50257 "$shard" 2
}

part3() {
  echo "== 3. configs/gpt2_124m.yaml, $batch × $block on random tokens, $warmup warm-up + $timed timed steps, bf16" \
    "(activations in bf16, and f32 with 16-bit copies) and tf32"
  gpt2_data
  local prec out rc half
  for prec in bf16 bf16-copies tf32; do
    out="$work/gpt2-$prec" half=on
    [[ $prec == bf16-copies ]] && half=off
    GPUTRAIN_HALF_ACTIVATIONS=$half timeout "$limit_run" "$gt" train configs/gpt2_124m.yaml --device "$dev" \
      --precision "${prec%-copies}" --quiet \
      --max-steps $((warmup + timed)) --out "$out" --set "data.train.path=$work/tok2/train_*.bin" \
      --set "data.test.path=$work/tok2/val_*.bin" --set "data.batch_size=$batch" --set "data.block_size=$block" \
      --set train.accumulate=1 --set train.eval_every=1000000 --set "train.eval_tokens=$block" \
      --set "train.log_every=$warmup" --set scheduler.warmup_steps=0 "${nominal[@]}" > "$out.log" 2>&1
    rc=$?
    if [[ $rc != 0 ]]; then
      echo "  gputrain $prec: FAILED with exit $rc$([[ $rc == 124 ]] && echo " (timed out after $limit_run s)")"
      tail -20 "$out.log" | sed 's/^/        /'
      status=1; continue
    fi
    $py - "$out/metrics.jsonl" "$warmup" "$timed" $((batch * block)) "$results/gputrain-$prec.json" "$prec" <<'PY' || status=1
import json, sys
path, warmup, timed, tokens_per_step, result, prec = sys.argv[1], *map(int, sys.argv[2:5]), *sys.argv[5:]
rows = [r for r in map(json.loads, open(path)) if r.get("type") == "train"]
after = [r for r in rows if r["step"] > warmup]
if not any(r["step"] == warmup for r in rows) or not after or after[-1]["step"] != warmup + timed:
    print(f"  gputrain {prec}: FAILED: metrics.jsonl has no rows that cover steps {warmup + 1}–{warmup + timed} alone")
    sys.exit(1)
seconds = sum(r["train_s"] for r in after)
rate = timed * tokens_per_step / seconds
# gputrain's MFU is its rate times a constant (3 × forward FLOPs per token over the peak): its rows' ratio.
mfu_per_rate = after[-1]["mfu"] / after[-1]["tokens_per_sec"] if "mfu" in after[-1] else None
peaks = [r["device_peak_mib"] for r in rows if "device_peak_mib" in r]
out = {"tokens_per_sec": rate, "seconds": seconds, "mfu": rate * mfu_per_rate if mfu_per_rate else None,
       "mfu_per_rate": mfu_per_rate, "peak_mib": max(peaks) if peaks else None}
json.dump(out, open(result, "w"))
mfu = f"MFU {100 * out['mfu']:.1f} %" if out["mfu"] else "MFU unknown"
peak = f"peak {out['peak_mib']:.0f} MiB" if out["peak_mib"] else "no device memory (CPU)"
print(f"  gputrain {prec}: {rate:,.0f} tokens/s over steps {warmup + 1}–{warmup + timed} ({seconds:.2f} s), {mfu}, {peak}")
PY
  done
}

part4() {
  echo "== 4. the same model and steps in PyTorch: eager tf32 (SDPA), eager bf16 autocast, torch.compile bf16 autocast"
  gpt2_data
  local attention=sdpa has_compile row args out t limit rc
  [[ $dry == 1 ]] && attention=auto  # torch without SDPA here: its masked softmax, named in the row
  has_compile=$($py -c "import torch; print(int(hasattr(torch, 'compile')))" 2>/dev/null)
  for row in eager-tf32 eager-bf16 compile-bf16; do
    args=(--precision "${row#*-}" --attention "$attention")
    limit=$limit_run
    [[ $row == compile-* ]] && args+=(--compile) limit=$limit_compile
    out="$results/torch-$row.json"
    if [[ $row == compile-* && $has_compile != 1 ]]; then
      t="torch $($py -c 'import torch; print(torch.__version__)' 2>/dev/null) has no torch.compile"
      echo "  torch $row: not run: $t"
      echo "{\"skipped\": \"$t\"}" > "$out"; continue
    fi
    t=$(timeout "$limit" "$py" bench/torch_gpt.py --data "$work/tok2/train_000000.bin" --device "$dev" --vocab 50257 \
          --vocab-rows 50304 --layers 12 --heads 12 --channels 768 --block "$block" --batch "$batch" \
          --steps "$timed" --warmup "$warmup" --threads "$threads" --preload "${args[@]}" 2>"$work/torch-$row.err")
    rc=$?
    t=$(printf '%s\n' "$t" | grep '^{' | tail -1)  # its JSON line, whatever else went to stdout
    if [[ $rc == 0 && -n $t ]]; then
      echo "$t" > "$out"
      echo "$t" | $py -c "
import json, sys
r = json.load(sys.stdin)
peak = 'n/a' if r['peak_mem_mib'] is None else f\"{r['peak_mem_mib']:.0f} MiB\"
print(f\"  torch $row: {r['tokens_per_sec']:,.0f} tokens/s over {r['steps']} steps ({r['timed_seconds']:.2f} s), attention {r['attention']}, torch {r['torch']}, peak {peak}\")"
    else
      echo "  torch $row: FAILED with exit $rc$([[ $rc == 124 ]] && echo " (timed out after $limit s)")"
      tail -5 "$work/torch-$row.err" | sed 's/^/        /'
      echo '{"failed": true}' > "$out"
    fi
  done
}

part5() {
  echo "== 5. where a bf16 GPT-2 step goes (activations in bf16): the profiler over steps 6–10, $batch × $block"
  gpt2_data
  local out="$work/gpt2-profile" rc
  GPUTRAIN_HALF_ACTIVATIONS=on timeout "$limit_run" "$gt" train configs/gpt2_124m.yaml --device "$dev" \
    --precision bf16 --quiet --max-steps 10 \
    --out "$out" --set "data.train.path=$work/tok2/train_*.bin" --set "data.test.path=$work/tok2/val_*.bin" \
    --set "data.batch_size=$batch" --set "data.block_size=$block" --set train.accumulate=1 \
    --set train.eval_every=1000000 --set "train.eval_tokens=$block" --set scheduler.warmup_steps=0 \
    --set +train.profile.start_step=6 --set +train.profile.steps=5 > "$out.log" 2>&1
  rc=$?
  if [[ $rc != 0 || ! -f $out/profile.txt ]]; then
    echo "  gputrain bf16 profile: FAILED with exit $rc$([[ $rc == 124 ]] && echo " (timed out after $limit_run s)")"
    tail -20 "$out.log" | sed 's/^/        /'
    status=1; return
  fi
  $py - "$out/profile.txt" <<'PY' || status=1
import collections, re, sys
# Rows: name, type, phase, calls, total ms, mean ms, % step, GFLOP/s (empty for layers without products).
row = re.compile(r"^(\S+)\s+(\S+)\s+(\S+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
lines = open(sys.argv[1]).read().splitlines()
rows = [m.groups() for m in map(row.match, lines) if m]
by = collections.defaultdict(float)
for name, kind, phase, calls, total, mean, share in rows:
    by[(kind, phase)] += float(total)
# A row's share of the step is its time over the steps' time: the largest row's ratio, least rounded, for all.
top = max(rows, key=lambda r: float(r[4]))
per_ms = float(top[6]) / float(top[4])
print("| layer type | phase | total ms | % step |")
print("|---|---|---|---|")
for (kind, phase), total in sorted(by.items(), key=lambda kv: -kv[1])[:12]:
    print(f"| {kind} | {phase} | {total:.2f} | {total * per_ms:.1f} |")
print()
print("\n".join(lines[:16]))
PY
}

# The GPT-2 table from the rows of parts 3 and 4 that ran. The torch rows' MFU takes gputrain's count and peak: its
# MFU per token/s at the same precision, or else `gputrain check`'s training FLOPs per token over the table of
# lib/ops/devices.cpp for this GPU (the H100 SXM, H200 and GH200 rows) or the dry run's nominal peak.
table() {
  local per_token
  per_token=$(timeout 60 "$gt" check configs/gpt2_124m.yaml --set "data.batch_size=$batch" --set "data.block_size=$block" \
                --set train.accumulate=1 2>/dev/null | sed -n 's/^per token: .*, \([0-9.]*\) MFLOP to train.*/\1/p')
  echo
  echo "== gpu_check --gpt2 $(date -u +%Y-%m-%d) on $(gpu_name)"
  $py - "$results" "${per_token:-0}" "$dry" "$(gpu_name)" "$batch" "$block" "$timed" <<'PY'
import json, os, sys
results, per_token, dry, gpu = sys.argv[1], float(sys.argv[2]) * 1e6, sys.argv[3] == "1", sys.argv[4]
batch, block, timed = sys.argv[5:8]
def load(name):
    path = os.path.join(results, name + ".json")
    try:
        return json.load(open(path)) if os.path.exists(path) else None
    except ValueError:
        return {"failed": True}
peak = {"tf32": 1.0, "bf16": 1.0} if dry else next(
    (p for names, p in ((("GH200", "H200"), {"tf32": 494.7, "bf16": 989}), (("H100",), {"tf32": 494.7, "bf16": 989}))
     if any(n in gpu for n in names) and "PCIe" not in gpu and "NVL" not in gpu), None)
def mfu_per_rate(prec):
    g = load(f"gputrain-{prec}")
    if g and g.get("mfu_per_rate"):
        return g["mfu_per_rate"]
    return per_token / (peak[prec] * 1e12) if peak and per_token else None
def rate(r):
    return r["tokens_per_sec"] if r and "tokens_per_sec" in r else None
rows = [("gputrain bf16", "gputrain-bf16", "bf16"),
        ("gputrain bf16, f32 activations with 16-bit copies", "gputrain-bf16-copies", "bf16"),
        ("gputrain tf32", "gputrain-tf32", "tf32"),
        ("torch eager tf32 (SDPA)", "torch-eager-tf32", "tf32"), ("torch eager bf16 autocast", "torch-eager-bf16", "bf16"),
        ("torch.compile bf16 autocast", "torch-compile-bf16", "bf16")]
ref = {"bf16": rate(load("torch-compile-bf16")), "tf32": rate(load("torch-eager-tf32"))}
print(f"| GPT-2 124M, {batch} × {block}, {timed} timed steps | tokens/s | MFU | ratio | peak memory | target |")
print("|---|---|---|---|---|---|")
for label, name, prec in rows:
    r = load(name)
    if r is None:
        continue
    if r.get("attention") == "manual":
        label = label.replace(" (SDPA)", "") + f" (masked softmax: torch {r['torch']} has no SDPA)"
    if "skipped" in r or "failed" in r:
        print(f"| {label} | {'not run: ' + r['skipped'] if 'skipped' in r else 'FAILED'} | | | | |")
        continue
    tok = r["tokens_per_sec"]
    m = r.get("mfu") if name.startswith("gputrain") else (tok * mfu_per_rate(prec) if mfu_per_rate(prec) else None)
    mem = r.get("peak_mib", r.get("peak_mem_mib"))
    ratio, target = "", ""
    if name == "gputrain-bf16":
        x = tok / ref["bf16"] if ref["bf16"] else None
        ratio = f"{x:.2f}× torch.compile" if x else "n/a: no torch.compile figure"
        met = "not judged" if x is None else "met" if tok >= 400000 and x >= 1.0 else "missed"
        target = f"≥ 400,000 tokens/s and ≥ 1.00× torch.compile: {met}"
    elif name == "gputrain-tf32":
        x = tok / ref["tf32"] if ref["tf32"] else None
        ratio = f"{x:.2f}× eager tf32" if x else "n/a: no eager tf32 figure"
        met = "not judged" if x is None else "met" if x >= 1.2 else "missed"
        target = f"≥ 1.20× eager tf32: {met}"
    elif name in ("torch-compile-bf16", "torch-eager-tf32"):
        ratio = "1.00 (reference)"
    print(f"| {label} | {tok:,.0f} | {'n/a' if m is None else f'{100 * m:.1f} %'} | {ratio} | "
          f"{'n/a' if mem is None else f'{mem:,.0f} MiB'} | {target} |")
what = "a nominal 1 TFLOP/s (dry run: CPU, meaningless)" if dry else "lib/ops/devices.cpp's peak for this GPU"
print(f"\nMFU: gputrain's count, 3 × forward FLOPs per token (6N plus attention: {per_token / 1e6:.1f} MFLOP per token), "
      f"over {what} in the row's precision (H200: tf32 494.7, bf16 989 TFLOP/s dense); the torch rows use the same.")
PY
}

took=()  # each part's seconds, for the last line: the check's budget is 5 minutes on an H200
for part in 1 2 3 4 5; do
  wants "$part" || continue
  SECONDS=0
  case $part in 1) part1 ;; 2) part2 ;; 3) part3 ;; 4) part4 ;; 5) part5 ;; esac
  took+=("part $part ${SECONDS} s")
done
if wants 3 || wants 4; then table; fi
spent=$(printf '%s, ' "${took[@]}")
echo "gpu_check --gpt2 (parts $parts): $([[ $status == 0 ]] && echo passed || echo FAILED) — ${spent%, }"
exit "$status"
