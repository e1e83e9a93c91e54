#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, CUDA 13 and PyTorch (no package registry), from a bundle
# made here by scripts/gpu_bundle.sh:
#   1. every [cuda] test case, one process each (a crash in one cannot hide the others), with its outcome and the
#      `rate:` lines it prints (cuDNN's flash attention at GPT-2's shape: TFLOP/s forward and backward);
#   2. fashion_mnist_mlp and fashion_mnist_cnn trained by gputrain on the GPU and by PyTorch eager on the GPU (same
#      model, batch 128, SGD momentum 0.9, fp32 with PyTorch's default math modes), samples/s of the training loop;
#   2b. both in tf32, bf16 and fp16 (train.precision: cuBLASLt and cuDNN with 16-bit operands and fp32 compute)
#      against PyTorch eager with TF32 flags / autocast (+ GradScaler for fp16): samples/s and peak memory;
#   3. the GPT of configs/gpt_bytes.yaml (batch 64 × T 64, random byte tokens) trained by both on the GPU in fp32,
#      tf32, bf16 and fp16: tokens/s, gputrain's MFU against the GPU's peak at each precision, the ratio (the fused
#      attention kernel is among the [cuda] tests); then gputrain's fp32 GPT with train.cuda_graphs;
#   4. one table: test results, samples/s of both, the ratio, peak device memory; then the MLP and CNN with
#      train.cuda_graphs and configs/fashion_mnist_speedrun.yaml op by op and captured (samples/s, test accuracy,
#      wall time); then the training paths (worker threads, the profiler, and dist.zero over NCCL when there are two
#      GPUs).
# Under 8 minutes on an H200. `--dry-run` runs the same steps here without a GPU: the tests report their skip, and
# both trainers run a few steps on the CPU, so the script's own logic is checked before device time is spent.
# `--only PATTERN` reruns just the [cuda] tests whose names match the Catch2 pattern (`*cross_entropy*`) and stops:
# the rerun after a fix, in seconds of device time instead of minutes. GPT-2 124M is a command of its own, so that
# each fits one call of the device tool: `--gpt2` runs scripts/gpu_check_gpt2.sh (cuDNN attention's [cuda] cases,
# a 2-layer GPT's bf16 losses on CUDA against the CPU's, configs/gpt2_124m.yaml in bf16 and tf32 against PyTorch
# eager and torch.compile; under 5 minutes) and stops, and `--gpt2-part N` runs its part N alone (see that script).
#
#   scripts/gpu_check.sh [--dry-run] [--only PATTERN | --gpt2 | --gpt2-part N] [BUNDLE=gpu_bundle]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
dry=0
only=
gpt2=()
while [[ ${1:-} == --* ]]; do
  case $1 in
    --dry-run) dry=1; shift ;;
    --only) only=${2:?--only needs a pattern}; shift 2 ;;
    --gpt2) gpt2=(--part "1,2,3,4"); shift ;;
    --gpt2-part) gpt2=(--part "${2:?--gpt2-part needs a part number, 1 to 5}"); shift 2 ;;
    *) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
  esac
done
if ((${#gpt2[@]})); then
  dry_flag=(); [[ $dry == 1 ]] && dry_flag=(--dry-run)
  exec scripts/gpu_check_gpt2.sh "${dry_flag[@]}" "${gpt2[@]}" "$@"
fi
bundle=${1:-gpu_bundle}
# shellcheck source=scripts/gpu_check_env.sh
source scripts/gpu_check_env.sh
data="$PWD/$bundle/data"
show_devices

echo "== [cuda] tests"
cuda_tests "[cuda]${only:+ $only}" 300
if [[ -n $only ]]; then
  echo "[cuda] tests matching $only: $pass passed, $fail failed, $skip skipped${failed:+ — failed: ${failed[*]}}"
  [[ $fail == 0 && $pass -gt 0 ]]
  exit
fi

echo "== training throughput, batch 128, in each precision against PyTorch eager (AMP for bf16/fp16)"
# gputrain's train.precision against bench/torch_reference.py --precision (bench/torch_amp.py: TF32 flags, autocast,
# a GradScaler for fp16) at the same model and batch. The CUDA backend's half mode covers dense layers' matmuls
# (cuBLASLt) and convolutions (cuDNN's 16-bit configurations), 16-bit operands with fp32 compute. A failed gputrain
# run fails the check (the dry run proves the commands here).
if [[ $dry == 1 ]]; then device=cpu; tdev=cpu; steps_mlp=20; steps_cnn=10; else device=cuda; tdev=cuda; steps_mlp=3000; steps_cnn=1500; fi
sets=(--set "data.train.images=$data/train-images-idx3-ubyte.gz" --set "data.train.labels=$data/train-labels-idx1-ubyte.gz"
      --set "data.test.images=$data/t10k-images-idx3-ubyte.gz" --set "data.test.labels=$data/t10k-labels-idx1-ubyte.gz"
      --set train.eval_every=1000000)
rows=()
hfail=0
for run in mlp:fp32 cnn:fp32 mlp:tf32 mlp:bf16 mlp:fp16 cnn:tf32 cnn:bf16 cnn:fp16; do
  model=${run%%:*}; prec=${run#*:}
  steps=$steps_mlp; [[ $model == cnn ]] && steps=$steps_cnn
  out="$work/run-$model-$prec"
  if "$gt" train "configs/fashion_mnist_$model.yaml" --device "$device" --precision "$prec" --max-steps "$steps" \
       --quiet --out "$out" "${sets[@]}" > "$work/gt-$model-$prec.log" 2>&1; then
    gt_rate=$($py -c "import json; print(round(json.load(open('$out/summary.json'))['samples_per_sec']))")
    gt_peak=$($py -c "
import json
rows = [json.loads(l) for l in open('$out/metrics.jsonl')]
peaks = [r['device_peak_mib'] for r in rows if 'device_peak_mib' in r]
print(f'{max(peaks):.0f}' if peaks else 'n/a')")
  else
    gt_rate=failed; gt_peak=n/a; hfail=$((hfail + 1))
    tail -20 "$work/gt-$model-$prec.log" | sed 's/^/        /'
  fi
  if t=$($py bench/torch_reference.py --model "$model" --device "$tdev" --precision "$prec" --steps "$steps" \
           --batch 128 --threads 4 2>"$work/torch-$model-$prec.err"); then
    torch_rate=$(echo "$t" | $py -c "import json, sys; print(round(json.load(sys.stdin)['samples_per_sec']))")
    torch_peak=$(echo "$t" | $py -c "import json, sys; p = json.load(sys.stdin)['peak_mem_mib']; print('n/a' if p is None else f'{p:.0f}')")
  else
    torch_rate=failed; torch_peak=n/a
    tail -2 "$work/torch-$model-$prec.err" | sed 's/^/        /'
  fi
  ratio=n/a
  [[ $gt_rate =~ ^[0-9]+$ && $torch_rate =~ ^[0-9]+$ ]] && ratio=$(awk -v a="$gt_rate" -v b="$torch_rate" 'BEGIN { printf "%.2f", a / b }')
  rows+=("$(printf '| fashion_mnist_%s %s | %s | %s | %s | %s MiB | %s MiB |' "$model" "$prec" "$gt_rate" "$torch_rate" "$ratio" "$gt_peak" "$torch_peak")")
done

echo "== GPT training throughput (configs/gpt_bytes.yaml's model, random byte tokens)"
# Both engines on the same GPT and shape: batch 64 × T 64 on the GPU (16 × 64 and a few steps in a dry run).
random_shards "$work/tok" 256 2000000 1
if [[ $dry == 1 ]]; then gpt_batch=16; gpt_steps=5; else gpt_batch=64; gpt_steps=300; fi
gpt_sets=(--set "data.train.path=$work/tok/train_*.bin" --set "data.test.path=$work/tok/val_*.bin"
          --set "data.batch_size=$gpt_batch" --set train.eval_every=1000000 --set train.eval_tokens=64
          --set train.log_every=10)
gpt_rows=()
# The last row: fp32 with train.cuda_graphs (gputrain alone, against the fp32 row's PyTorch figure): the whole GPT
# step captured, the embedding's sorted backward (CUB) included. Not on the CPU, which refuses the key.
gpt_runs=(fp32 tf32 bf16 fp16)
[[ $dry == 0 ]] && gpt_runs+=(fp32+graphs)
torch_fp32=n/a
for run in "${gpt_runs[@]}"; do
  prec=${run%+graphs}
  extra=(); [[ $run == *+graphs ]] && extra=(--set +train.cuda_graphs=true)
  gpt_out="$work/run-gpt-$run"
  if "$gt" train configs/gpt_bytes.yaml --device "$device" --precision "$prec" --max-steps "$gpt_steps" --quiet \
       --out "$gpt_out" "${gpt_sets[@]}" "${extra[@]}" > "$work/gt-gpt-$run.log" 2>&1; then
    read -r gpt_rate gpt_mfu gpt_peak < <($py -c "
import json
rows = [json.loads(l) for l in open('$gpt_out/metrics.jsonl') if '\"train\"' in l]
last = rows[len(rows) // 2:]  # the second half: past start-up
rate = sum(r['tokens_per_sec'] for r in last) / len(last)
mfu = [r['mfu'] for r in last if 'mfu' in r]
peaks = [r['device_peak_mib'] for r in rows if 'device_peak_mib' in r]
print(round(rate), f'{100 * sum(mfu) / len(mfu):.1f}%' if mfu else 'unknown', f'{max(peaks):.0f}' if peaks else 'n/a')")
  else
    gpt_rate=failed gpt_mfu=n/a gpt_peak=n/a; hfail=$((hfail + 1))
    tail -20 "$work/gt-gpt-$run.log" | sed 's/^/        /'
  fi
  if [[ $run == *+graphs ]]; then
    torch_gpt=$torch_fp32
  elif t=$($py bench/torch_gpt.py --data "$work/tok/train_000000.bin" --device "$tdev" --batch "$gpt_batch" \
           --steps "$gpt_steps" --threads 4 --precision "$prec" 2>"$work/torch-gpt-$prec.err"); then
    torch_gpt=$(echo "$t" | $py -c "import json, sys; print(round(json.load(sys.stdin)['tokens_per_sec']))")
  else
    torch_gpt=failed
    tail -5 "$work/torch-gpt-$prec.err" | sed 's/^/        /'
  fi
  gpt_ratio=n/a
  [[ $gpt_rate =~ ^[0-9]+$ && $torch_gpt =~ ^[0-9]+$ ]] && gpt_ratio=$(awk -v a="$gpt_rate" -v b="$torch_gpt" 'BEGIN { printf "%.2f", a / b }')
  [[ $run == fp32 ]] && torch_fp32=$torch_gpt
  gpt_rows+=("| $device ${run/+graphs/, cuda_graphs} | $gpt_rate | $gpt_mfu | $torch_gpt | $gpt_ratio | $gpt_peak MiB |")
done

echo "== CUDA graphs (train.cuda_graphs) and the speedrun config"
# The MLP and CNN rows again with the step captured into one CUDA graph after warm-up and replayed (the last partial
# batch of an epoch dropped), beside the same runs uncaptured above; then configs/fashion_mnist_speedrun.yaml whole,
# op by op and captured (test accuracy and wall time: its target is ~93 % in 3 minutes on 2 CPU cores). A dry run has
# no GPU: it checks that cuda_graphs on the CPU is refused with exit 2 naming the key, and runs the speedrun config
# for a few steps. A failed run fails the check. (The [cuda] tests above compare captured and uncaptured runs bit
# for bit.)
graph_rows=() gfail=0
summary_of() {  # run dir → "samples/s | test accuracy | seconds"
  $py -c "
import json
s = json.load(open('$1/summary.json'))
acc = s.get('test_accuracy')
print(f\"{round(s['samples_per_sec'])} | {'n/a' if acc is None else f'{acc:.4f}'} | {s['wall_seconds']:.1f} s\")"
}
graph_run() {  # name, config, gputrain args...
  local name=$1 config=$2; shift 2
  local out="$work/graph-${name//[^a-zA-Z0-9]/_}"
  if "$gt" train "$config" --quiet --out "$out" "${sets[@]}" "$@" > "$out.log" 2>&1; then
    graph_rows+=("| $name | $(summary_of "$out") |")
  else
    graph_rows+=("| $name | FAILED | | |"); gfail=$((gfail + 1))
    tail -15 "$out.log" | sed 's/^/        /'
  fi
}
if [[ $dry == 1 ]]; then
  if "$gt" train configs/fashion_mnist_mlp.yaml --device cpu --max-steps 5 --quiet --out "$work/graph-cpu" \
       "${sets[@]}" --set +train.cuda_graphs=true > "$work/graph-cpu.log" 2>&1; then
    graph_rows+=("| cuda_graphs on the CPU | FAILED: not refused | | |"); gfail=$((gfail + 1))
  elif [[ $? == 2 ]] && grep -q "train.cuda_graphs" "$work/graph-cpu.log"; then
    graph_rows+=("| cuda_graphs on the CPU | refused (exit 2, names train.cuda_graphs) | | |")
  else
    graph_rows+=("| cuda_graphs on the CPU | FAILED: not a config error | | |"); gfail=$((gfail + 1))
    tail -5 "$work/graph-cpu.log" | sed 's/^/        /'
  fi
  graph_run "fashion_mnist_speedrun, cpu, 20 steps" configs/fashion_mnist_speedrun.yaml --device cpu --max-steps 20
else
  graph_run "fashion_mnist_mlp, cuda_graphs" configs/fashion_mnist_mlp.yaml --device cuda --max-steps "$steps_mlp" \
    --set +train.cuda_graphs=true
  graph_run "fashion_mnist_cnn, cuda_graphs" configs/fashion_mnist_cnn.yaml --device cuda --max-steps "$steps_cnn" \
    --set +train.cuda_graphs=true
  graph_run "fashion_mnist_speedrun, op by op" configs/fashion_mnist_speedrun.yaml --device cuda
  graph_run "fashion_mnist_speedrun, cuda_graphs" configs/fashion_mnist_speedrun.yaml --device cuda \
    --set +train.cuda_graphs=true
fi

echo "== training paths"
# The worker-thread path with one device (device: [0]), and the profiler timing a GPU with CUDA events.
paths=() pfail=0
if [[ $dry == 1 ]]; then list='[cpu]'; else list='[0]'; fi
path_run() {  # name, expected text in a file of the run ("" = none), file, gputrain args...
  local name=$1 want=$2 file=$3; shift 3
  local out="$work/path-${name// /_}"
  if "$gt" train configs/fashion_mnist_mlp.yaml --quiet --out "$out" "${sets[@]}" "$@" > "$out.log" 2>&1 &&
     { [[ -z $want ]] || grep -q "$want" "$out/$file"; }; then
    paths+=("| $name | ok: $($py -c "import json; s = json.load(open('$out/summary.json')); print(f\"{s['steps']} steps, test accuracy {s['test_accuracy']:.3f}\")") |")
  else
    paths+=("| $name | FAILED |"); pfail=$((pfail + 1))
    tail -15 "$out.log" | sed 's/^/        /'
  fi
}
path_run "worker threads, device $list" "" summary.json --device "$list" --max-steps 300 --set train.eval_every=300
# dist.zero over NCCL trains only with a GPU per rank (NCCL refuses two ranks on one device): zero 0 and 2 side by
# side on two GPUs; on one the [cuda] tests above are its check (thread ranks on one GPU, NCCL of one rank).
ngpu=0
command -v nvidia-smi >/dev/null && ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [[ $dry == 1 ]]; then
  path_run "dist.zero 2, device [cpu, cpu]" "" summary.json --device '[cpu, cpu]' --max-steps 40 --set dist.zero=2 \
    --set train.eval_every=40
elif ((ngpu >= 2)); then
  for z in 0 2; do
    path_run "dist.zero $z, device [0, 1] (NCCL)" "" summary.json --device '[0, 1]' --max-steps 300 \
      --set dist.zero=$z --set train.eval_every=300
  done
else
  paths+=("| dist.zero over NCCL | not run: $ngpu GPU here, NCCL needs one per rank (see the [cuda] tests) |")
fi
if [[ $dry == 1 ]]; then
  path_run "profiler on $device" "ms per step" profile.txt --device "$device" --max-steps 40 --profile
else
  path_run "profiler on $device (CUDA events)" "device time, CUDA events" profile.txt --device "$device" --max-steps 40 --profile
fi

echo
echo "== gpu_check $(date -u +%Y-%m-%d) on $(gpu_name)"
echo "[cuda] tests: $pass passed, $fail failed, $skip skipped${failed:+ — failed: ${failed[*]}}"
echo
echo "| config | gputrain samples/s | PyTorch samples/s | ratio | gputrain peak mem | PyTorch peak mem |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "| GPT (gpt_bytes model, batch $gpt_batch × 64) | gputrain tokens/s | MFU | PyTorch eager tokens/s | ratio | gputrain peak mem |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${gpt_rows[@]}"
echo
echo "| CUDA graphs and the speedrun | samples/s | test accuracy | wall time |"
echo "|---|---|---|---|"
printf '%s\n' "${graph_rows[@]}"
echo
echo "| path | result |"
echo "|---|---|"
printf '%s\n' "${paths[@]}"
[[ $fail == 0 && $pfail == 0 && $hfail == 0 && $gfail == 0 ]]
