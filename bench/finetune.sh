#!/usr/bin/env bash
# Fine-tuning recipes, measured (docs/runs.md "Fine-tuning recipes" quotes the table this prints):
#   1. a byte-level GPT (configs/gpt_bytes.yaml) pretrained on Debian's fortunes, written as an llm.c file, then
#      trained on Debian's license texts from that file — all weights, or LoRA adapters alone — against the same model
#      trained on the licenses from scratch for the same steps; validation loss on the licenses' held-out split;
#   2. the shipped CNN trained one epoch on Fashion-MNIST, then a new head on its frozen body, against the same steps
#      from scratch.
# Usage: bench/finetune.sh [OUT] (default /tmp/gputrain-finetune; replaced). PRE_STEPS, FT_STEPS, CNN_STEPS and
# THREADS change the lengths and the CPU threads; GPUTRAIN names the binary (default build/gputrain).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${GPUTRAIN:-build/gputrain}
OUT=${1:-/tmp/gputrain-finetune}
PRE_STEPS=${PRE_STEPS:-1000}
FT_STEPS=${FT_STEPS:-300}
CNN_STEPS=${CNN_STEPS:-50}
THREADS=${THREADS:-2}
rm -rf "$OUT"
mkdir -p "$OUT"
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d.get(sys.argv[2], 'n/a'))" "$@"; }

"$B" tokenize $(find /usr/share/games/fortunes -type f ! -name '*.dat' | sort) --out "$OUT/fortunes" >&2
"$B" tokenize $(find /usr/share/common-licenses -type f | sort) --out "$OUT/licenses" >&2
fortunes=(--set "data.train.path=$OUT/fortunes/train_*.bin" --set "data.test.path=$OUT/fortunes/val_*.bin")
licenses=(--set "data.train.path=$OUT/licenses/train_*.bin" --set "data.test.path=$OUT/licenses/val_*.bin"
  --set train.max_steps="$FT_STEPS" --set train.eval_tokens=0)
run() { "$B" train configs/gpt_bytes.yaml --quiet --threads "$THREADS" "$@"; }

log "pretraining on fortunes: $PRE_STEPS steps"
run "${fortunes[@]}" --set train.max_steps="$PRE_STEPS" --out "$OUT/pre"
"$B" export llmc configs/gpt_bytes.yaml --checkpoint "$OUT/pre" --out "$OUT/pre.bin" >&2
"$B" eval configs/gpt_bytes.yaml "${licenses[@]}" --checkpoint "$OUT/pre" --json > "$OUT/pre_on_licenses.json"

log "on the licenses: from scratch, all weights from pre.bin, LoRA from pre.bin ($FT_STEPS steps each)"
run "${licenses[@]}" --out "$OUT/scratch"
run "${licenses[@]}" --set "+train.init_from=$OUT/pre.bin" --set optimizer.lr=3e-4 --out "$OUT/full"
lora='{targets: ["*.attn.qkv.weight", "*.attn.proj.weight", "*.fc.weight", "*.proj.weight"], rank: 8, alpha: 16}'
run "${licenses[@]}" --set "+train.init_from=$OUT/pre.bin" --set "+train.lora=$lora" --set optimizer.lr=3e-3 \
  --out "$OUT/lora"
"$B" export llmc configs/gpt_bytes.yaml "${licenses[@]}" --set "+train.lora=$lora" --checkpoint "$OUT/lora" \
  --out "$OUT/lora_merged.bin" --merge-lora >&2

log "the CNN: one epoch, then $CNN_STEPS steps of a new head on the frozen body, and $CNN_STEPS from scratch"
cnn() { "$B" train configs/fashion_mnist_cnn.yaml --quiet --threads "$THREADS" "$@"; }
cnn --set train.epochs=1 --out "$OUT/cnn"
cnn --set train.max_steps="$CNN_STEPS" --set "+train.init_from=$OUT/cnn" --set '+train.init_skip=[layers.9.*]' \
  --set '+train.freeze=[layers.0.*, layers.3.*, layers.7.*]' --out "$OUT/cnn_head"
cnn --set train.max_steps="$CNN_STEPS" --out "$OUT/cnn_scratch"

echo
echo "| run | trained | steps | validation loss | bits per byte |"
echo "|---|---|---|---|---|"
echo "| fortunes model, no training on the licenses | — | 0 | $(json "$OUT/pre_on_licenses.json" test_loss) | $(json "$OUT/pre_on_licenses.json" test_bpb) |"
for r in scratch full lora; do
  what=$(case $r in scratch) echo "all, from scratch" ;; full) echo "all, from pre.bin" ;; lora) echo "LoRA r 8 on attention and MLP" ;; esac)
  echo "| $r | $what | $(json "$OUT/$r/summary.json" steps) | $(json "$OUT/$r/summary.json" test_loss) | $(json "$OUT/$r/summary.json" test_bpb) |"
done
echo
echo "| CNN run | steps | test accuracy | test loss |"
echo "|---|---|---|---|"
for r in cnn cnn_head cnn_scratch; do
  echo "| $r | $(json "$OUT/$r/summary.json" steps) | $(json "$OUT/$r/summary.json" test_accuracy) | $(json "$OUT/$r/summary.json" test_loss) |"
done
echo
echo "A sample of the fully fine-tuned model:"
"$B" generate configs/gpt_bytes.yaml --checkpoint "$OUT/full" --prompt "This License " --tokens 200 --seed 1 2>/dev/null
echo
"$B" check configs/gpt_bytes.yaml "${licenses[@]}" --set "+train.lora=$lora" | grep "^trainable"
"$B" check configs/fashion_mnist_cnn.yaml --set '+train.freeze=[layers.0.*, layers.3.*, layers.7.*]' | grep "^trainable"
