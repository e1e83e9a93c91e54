#!/usr/bin/env bash
# The first-hour paths of README.md ("Your first hour"), run as a newcomer types them (from the repository root,
# the default folders), each shortened by a step limit: check; train; interrupt and resume with the command the run
# prints; a GPT on your own text (tokenize, train, eval, generate from the run directory); a sweep and `gputrain
# runs`; an image folder; a 2-rank run under mpirun. Run by ctest (`newcomer_paths`); it must stay under 3 minutes.
# Usage: tests/newcomer_paths.sh BUILD/gputrain SOURCE_DIR
set -euo pipefail
gt=$(realpath "$1")
src=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The repository's configs and scripts, in a folder of its own (runs/, data/ and sweeps/ are made under it).
mkdir -p "$work/repo/build"
cp -r "$src/configs" "$src/scripts" "$work/repo/"
ln -s "$gt" "$work/repo/build/gputrain"
cd "$work/repo"
start=$SECONDS
step() { echo "== $* ($((SECONDS - start)) s)"; }
fail() {
  echo "newcomer_paths: $*" >&2
  exit 1
}

step "check"
build/gputrain check configs/fashion_mnist_cnn.yaml > check.log 2>&1 || fail "check: $(tail -3 check.log)"
grep -q '^fits on ' check.log || fail "check printed no fits line: $(tail -3 check.log)"

step "train"
build/gputrain train configs/fashion_mnist_mlp.yaml --max-steps 60 --no-progress > train.log 2>&1 || fail "train: $(tail -3 train.log)"
run=$(ls -d runs/fashion_mnist_mlp/*)
[ -f "$run/summary.json" ] || fail "train wrote no summary.json in $run"

step "interrupt, then the printed resume command"
build/gputrain train configs/fashion_mnist_mlp.yaml --epochs 1 --set checkpoint.every_steps=20 --no-progress \
  --out runs/stopped > stopped.log 2>&1 &
pid=$!
for _ in $(seq 600); do [ -f runs/stopped/checkpoints/latest ] && break; sleep 0.1; done
kill -TERM "$pid"
code=0
wait "$pid" || code=$?
[ "$code" = 75 ] || fail "interrupted run exited $code, not 75: $(tail -3 stopped.log)"
resume=$(sed -n 's/.*interrupted (resume with: \([^)]*\)).*/\1/p' stopped.log)
[ -n "$resume" ] || fail "the interrupted run printed no resume command: $(tail -3 stopped.log)"
(cd / && ${resume/gputrain/$gt} --no-progress > "$work/repo/resumed.log" 2>&1) || fail "$resume: $(tail -3 resumed.log)"
grep -q '"exit_reason": "completed"' runs/stopped/summary.json || fail "the resumed run did not complete"
# A finished run is left alone by --resume auto: a new run starts beside it.
before=$(sha256sum "$run/summary.json")
build/gputrain train configs/fashion_mnist_mlp.yaml --max-steps 10 --resume auto --no-progress > again.log 2>&1 ||
  fail "resume auto after a finished run: $(tail -3 again.log)"
[ "$(sha256sum "$run/summary.json")" = "$before" ] || fail "--resume auto rewrote the finished run $run"

step "a GPT on your own text"
build/gputrain tokenize $(find /usr/share/games/fortunes -type f ! -name '*.dat' | sort) --out data/fortunes > tok.log
build/gputrain train configs/gpt_bytes.yaml --max-steps 20 --set train.eval_tokens=4096 --out runs/gpt_bytes \
  --no-progress > gpt.log 2>&1 || fail "gpt train: $(tail -3 gpt.log)"
build/gputrain eval runs/gpt_bytes --set train.eval_tokens=4096 --json > eval.json 2> eval.err ||
  fail "eval RUN: $(cat eval.err)"
python3 -c 'import json, sys; json.load(open(sys.argv[1]))["test_bpb"]' eval.json || fail "eval --json is not JSON"
build/gputrain generate runs/gpt_bytes --prompt "The " --tokens 40 > gen.txt 2> gen.err || fail "generate RUN: $(cat gen.err)"
[[ $(head -c 4 gen.txt) == "The " ]] || fail "generate did not start with the prompt"

step "a sweep, then gputrain runs"
build/gputrain sweep configs/fashion_mnist_mlp.yaml --grid optimizer.lr=0.03,0.1 --set train.max_steps=30 \
  --out sweeps/lr > sweep.log 2>&1 || fail "sweep: $(tail -3 sweep.log)"
build/gputrain runs sweeps/lr --sort test_accuracy --desc --csv > runs.csv 2> runs.err || fail "runs: $(cat runs.err)"
[ "$(wc -l < runs.csv)" = 3 ] || fail "runs --csv: $(cat runs.csv)"
python3 -c 'import csv, sys; rows = list(csv.DictReader(open(sys.argv[1]))); assert {r["optimizer.lr"] for r in rows} == {"0.03", "0.1"}' runs.csv ||
  fail "runs --csv does not list both learning rates"

step "an image folder"
/usr/bin/python3 scripts/fashion_folder.py data/fashion_folder --per-class 30 > folder.log
build/gputrain train configs/image_folder.yaml --max-steps 10 --no-progress --out runs/images > images.log 2>&1 ||
  fail "image folder: $(tail -3 images.log)"

step "2 ranks under mpirun"
if command -v mpirun > /dev/null; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    mpirun -np 2 build/gputrain train configs/fashion_mnist_mlp.yaml --threads 1 --max-steps 20 --out runs/two \
    > two.log 2>&1 || fail "mpirun -np 2: $(tail -3 two.log)"
  grep -q '"world_size": 2' runs/two/summary.json || fail "the 2-rank run's summary says another world size"
else
  echo "(mpirun not installed: scripts/setup.sh installs openmpi-bin)"
fi
step "done"
elapsed=$((SECONDS - start))
[ "$elapsed" -lt 180 ] || fail "the paths took ${elapsed} s, more than 3 minutes"
