#!/usr/bin/env bash
# What dist.zero costs and saves on CPU ranks under mpirun, from the runs' own summary.json (docs/measurements.md
# quotes the tables this prints):
#   1. bench/zero_memory.yaml (a byte GPT whose memory is its parameters': 25.4 M of them, 406 MB of training state)
#      at 1, 2 and 4 ranks and dist.zero 0 to 3: each rank's peak tensor bytes over the whole process and over the
#      steps alone, its peak RSS, beside `gputrain check --world-size N --json`'s per-rank figure for that stage
#      (zero_stages[].per_rank_bytes; "n/a" where check has no figure for the stage), and samples/s against
#      stage 0's at the same ranks. One rank runs stage 0 alone (dist.zero needs several ranks).
#   2. the gate: configs/gpt_bytes.yaml on 2 MPI ranks, dist.zero 3 against 0 in ROUNDS interleaved rounds; the
#      median step-time ratio (stage 0's samples/s over stage 3's) must be at most 1.3.
# Usage: bench/zero_memory.sh [OUT] (default /tmp/gputrain-zero-memory; replaced). ROUNDS (3), GATE_STEPS (150),
# STEPS (6) and RANKS ("1 2 4") change the lengths; GPUTRAIN names the binary (default build/gputrain).
# Exit 1 when the gate fails.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${GPUTRAIN:-build/gputrain}
OUT=${1:-/tmp/gputrain-zero-memory}
ROUNDS=${ROUNDS:-3}
GATE_STEPS=${GATE_STEPS:-150}
STEPS=${STEPS:-6}
RANKS=${RANKS:-1 2 4}
rm -rf "$OUT"
mkdir -p "$OUT"
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
# As CI runs mpirun (as root, oversubscribed past the cores: memory does not care); glibc's arenas and OpenBLAS's
# threads held down, as the tests do.
mpi() {
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    MALLOC_ARENA_MAX=2 OPENBLAS_NUM_THREADS=1 mpirun -np "$1" "${@:2}"
}

"$B" tokenize $(find /usr/share/games/fortunes -type f ! -name '*.dat' | sort) --out "$OUT/fortunes" >&2
data=(--set "data.train.path=$OUT/fortunes/train_*.bin")
"$B" devices | head -3 >&2

# 1. Memory at 1, 2 and 4 ranks.
cfg=bench/zero_memory.yaml
for n in $RANKS; do
  "$B" check "$cfg" "${data[@]}" --world-size "$n" --json > "$OUT/check$n.json" 2> /dev/null
  stages="0 1 2 3"
  [[ $n == 1 ]] && stages=0
  for z in $stages; do
    log "$cfg: $n rank(s), dist.zero $z"
    mpi "$n" "$B" train "$cfg" "${data[@]}" --threads 1 --quiet --set train.max_steps="$STEPS" \
      --set dist.zero="$z" --out "$OUT/r${n}_z$z" > "$OUT/r${n}_z$z.log" 2>&1
  done
done
python3 - "$OUT" $RANKS <<'EOF'
import json, sys
out, ranks = sys.argv[1], [int(n) for n in sys.argv[2:]]
mb = lambda b: f"{b / 1e6:.1f}"
print("| ranks | dist.zero | peak tensor MB (whole run) | peak tensor MB (steps) | peak RSS MB | check's per-rank MB "
      "| samples/s | step time vs zero 0 |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for n in ranks:
    check = {z["stage"]: z["per_rank_bytes"] for z in json.load(open(f"{out}/check{n}.json"))["zero_stages"]
             if not z.get("offload")}
    base = None
    for z in ([0] if n == 1 else [0, 1, 2, 3]):
        s = json.load(open(f"{out}/r{n}_z{z}/summary.json"))
        per = s["memory"]["per_process"]
        top = lambda key: max(p[key] for p in per)  # the largest rank's
        sps = s["samples_per_sec"]
        base = base or sps
        print(f"| {n} | {z} | {mb(top('peak_tensor_bytes'))} | {mb(top('peak_step_tensor_bytes'))} "
              f"| {mb(top('peak_rss_bytes'))} | {mb(check[z]) if z in check else 'n/a'} | {sps:.2f} | {base / sps:.2f}× |")
EOF

# 2. The gate: gpt_bytes on 2 ranks, dist.zero 3 against 0, interleaved.
log "gate: configs/gpt_bytes.yaml, 2 ranks, $GATE_STEPS steps, $ROUNDS rounds"
gate=(--set "data.train.path=$OUT/fortunes/train_*.bin" --set data.test=null --set train.max_steps="$GATE_STEPS"
  --set logging.report=false --set logging.tensorboard=false)
for r in $(seq 1 "$ROUNDS"); do
  for z in 0 3; do
    mpi 2 "$B" train configs/gpt_bytes.yaml "${gate[@]}" --device cpu --threads 1 --quiet --set dist.zero="$z" \
      --out "$OUT/gate_z${z}_$r" > "$OUT/gate_z${z}_$r.log" 2>&1
  done
done
python3 - "$OUT" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
sps = lambda z, r: json.load(open(f"{out}/gate_z{z}_{r}/summary.json"))["samples_per_sec"]
z0 = [sps(0, r) for r in range(1, rounds + 1)]
z3 = [sps(3, r) for r in range(1, rounds + 1)]
ratios = [a / b for a, b in zip(z0, z3)]
ratio = statistics.median(ratios)
print(f"gate: gpt_bytes, 2 MPI ranks: zero 0 {statistics.median(z0):.1f} samples/s, zero 3 "
      f"{statistics.median(z3):.1f} samples/s; step time zero 3 / zero 0 = {ratio:.2f}× (median; rounds "
      + ", ".join(f"{x:.2f}" for x in ratios) + f"×), {'PASS' if ratio <= 1.3 else 'FAIL'} (at most 1.3×)")
sys.exit(0 if ratio <= 1.3 else 1)
EOF
