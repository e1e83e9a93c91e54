#!/usr/bin/env bash
# Prints a fingerprint of training numerics: every logged loss, gradient norm and evaluation of short fixed-seed runs
# of each shipped config (and a few variants: Adam with a schedule and accumulation, two worker threads). Two
# binaries that print the same text train bit-identically on these runs, which is how a refactor shows it changed no
# numerics:
#   scripts/loss_fingerprint.sh /tmp/old/gputrain > old.txt; scripts/loss_fingerprint.sh build/gputrain > new.txt
#   diff old.txt new.txt
# Losses are printed with 17 significant digits (an f64 round trip), so any change in the arithmetic shows.
set -euo pipefail
bin=$(realpath "${1:-build/gputrain}")
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() {  # run NAME CONFIG ARGS...
  local name=$1 config=$2
  shift 2
  "$bin" train "$config" --threads 2 --quiet --no-progress --out "$tmp/$name" --set train.log_every=1 "$@" \
    > "$tmp/$name.out" 2>&1 || { echo "$name: exit $?"; cat "$tmp/$name.out"; exit 1; }
  python3 - "$name" "$tmp/$name/metrics.jsonl" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
for line in open(path):
    r = json.loads(line)
    keys = [k for k in ("step", "loss", "grad_norm", "lr", "test_loss", "test_accuracy") if k in r]
    print(name, r["type"], " ".join(f"{k}={r[k]!r}" if not isinstance(r[k], float) else f"{k}={r[k]:.17g}"
                                    for k in keys))
PY
}

run seed_linear configs/seed_linear.yaml
run mlp configs/fashion_mnist_mlp.yaml --max-steps 120 --set train.eval_every=60
run cnn configs/fashion_mnist_cnn.yaml --max-steps 30 --set train.eval_every=30
run resnet configs/fashion_mnist_resnet.yaml --max-steps 12 --set data.batch_size=64
run mlp_adam configs/fashion_mnist_mlp.yaml --max-steps 60 --set train.accumulate=2 \
  --set 'optimizer={type: adamw, lr: 0.001, weight_decay: 0.01}' \
  --set 'scheduler={type: cosine, warmup_steps: 10}' --set 'train.grad_clip={max_norm: 1.0}'
run mlp_workers configs/fashion_mnist_mlp.yaml --max-steps 40 --device '[cpu, cpu]'
