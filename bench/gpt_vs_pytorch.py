#!/usr/bin/env python3
"""Training tokens/s of gputrain against PyTorch eager on the same GPT (configs/gpt_bytes.yaml: 4 layers, 4 heads,
128 channels, T = 64, batch 16, AdamW, gradient clipping) on the CPU, with the machine's measured SGEMM peak and each
engine's share of it.

    scripts/setup.sh && bench/torch_venv.sh && bench/gpt_vs_pytorch.py [--rounds 5] [--steps 120] [--threads 2]
                                                                        [--torch-threads 1,2] [--infer-batch 64]
                                                                        [--infer-seconds 3] [--json PATH]

References: Debian's torch 1.13 (/usr/bin/python3) and the current torch from PyPI in bench/.venv (made by
bench/torch_venv.sh; skipped with a note when absent), each at 1 and 2 threads; the ratio is gputrain's over the
fastest of those rows (each PyTorch at its best thread count, as the speed targets below define it). Each round measures
the peak (side_by_side.py says what and why) and then runs every engine once, starting one engine later each round;
each figure is the median of its rounds (this shared machine drifts by ±30 % between minutes). All engines are timed
the same way: 5 warm-up steps, then --steps steps (gputrain's from the training clock of its metrics.jsonl rows).
Data: the fortunes shards of the README (tokenized here when missing).

Inference: forward passes in evaluation mode over --infer-batch full windows of T tokens (the logits of every
position, as evaluation and scoring compute them; not token-by-token generation): gputrain's bench_infer_rate (random
token ids, --infer-seconds per round) against torch_gpt.py --infer (torch.inference_mode(), windows of the shard).

FLOPs per token are the model's as gputrain's MFU counts them (3 × the forward: 6N plus the causal attention), read
back from the mfu of gputrain's own metrics rows (the run is given the round's peak as train.peak_tflops), so this
script has no formula of its own; every engine is credited with the same model FLOPs, whatever its kernels execute
(PyTorch 1.13's masked attention computes the full score matrix). --json PATH writes the table (engine, rate,
GFLOP/s, share of the peak, ratio, every round) for scripts that regenerate README figures.
"""
import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile

from side_by_side import GPUTRAIN, ROOT, Report, Row, check_json_path, rotated, sgemm_peak, torch_pythons

CONFIG = os.path.join(ROOT, "configs", "gpt_bytes.yaml")
T, BATCH, WARMUP = 64, 16, 5
# The speed targets: training >= 1.5x the fastest PyTorch at >= 60 % of the peak; inference >= 2x.
TARGETS = {"train": (1.5, 0.6), "infer": (2.0, None)}
BUILD = os.path.dirname(GPUTRAIN)


def shards():
    data = os.path.join(ROOT, "data", "fortunes")
    if not glob.glob(os.path.join(data, "train_*.bin")):
        files = sorted(f for f in glob.glob("/usr/share/games/fortunes/*")
                       if os.path.isfile(f) and not os.path.islink(f) and not f.endswith(".dat"))
        subprocess.run([GPUTRAIN, "tokenize", *files, "--out", data], check=True, stdout=subprocess.DEVNULL)
    return data


def gputrain_rate(data, steps, threads, peak_gflops):
    """(training tokens/s over `steps` steps after WARMUP, as torch_gpt.py times PyTorch; training FLOPs per token).
    The rate comes from the metrics rows logged at the end of step WARMUP and of the last step (elapsed_s is the
    run's training clock); the FLOPs from a row's mfu, which gputrain logs once it is given a peak."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([GPUTRAIN, "train", CONFIG, "--device", "cpu", "--threads", str(threads), "--max-steps",
                        str(WARMUP + steps), "--quiet", "--set", f"data.train.path={data}/train_*.bin", "--set",
                        f"data.test.path={data}/val_*.bin", "--set", "train.eval_every=1000000", "--set",
                        "train.eval_tokens=64", "--set", f"train.log_every={WARMUP}", "--set",
                        f"train.peak_tflops={peak_gflops / 1000!r}", "--out", os.path.join(out, "run")], check=True)
        with open(os.path.join(out, "run", "metrics.jsonl")) as f:
            rows = {r["step"]: r for r in map(json.loads, f) if r.get("type") == "train"}
        last = max(rows)
        assert last == WARMUP + steps and WARMUP in rows, f"metrics.jsonl rows at steps {sorted(rows)}"
        assert "mfu" in rows[last], "metrics.jsonl has no mfu although train.peak_tflops was set"
        # mfu = tokens/s × FLOPs per token / peak (lib/train/hooks.cpp), with the peak in FLOP/s.
        flops_per_token = rows[last]["mfu"] * peak_gflops * 1e9 / rows[last]["tokens_per_sec"]
        return steps * BATCH * T / (rows[last]["elapsed_s"] - rows[WARMUP]["elapsed_s"]), flops_per_token


def gputrain_infer(data, batch, threads, seconds):
    """Inference tokens/s: bench_infer_rate's windows/s × T (it reads the config's data only for the vocabulary)."""
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "gpt.yaml")
        with open(CONFIG) as f:
            text = f.read().replace("data/fortunes/", data.rstrip("/") + "/")
        with open(config, "w") as f:
            f.write(text)
        out = subprocess.run([os.path.join(BUILD, "bench_infer_rate"), config, str(batch), str(threads),
                              str(seconds)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["samples_per_sec"] * T


def torch_rate(python, data, steps, threads, batch=BATCH, infer=False):
    cmd = [python, os.path.join(ROOT, "bench", "torch_gpt.py"), "--data", os.path.join(data, "train_000000.bin"),
           "--steps", str(steps), "--warmup", str(WARMUP if not infer else 3), "--threads", str(threads), "--block",
           str(T), "--batch", str(batch)]
    out = subprocess.run(cmd + (["--infer"] if infer else []), check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["tokens_per_sec"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--threads", type=int, default=2, help="gputrain's threads")
    ap.add_argument("--torch-threads", default="1,2", help="PyTorch's thread counts, each a row")
    ap.add_argument("--infer-batch", type=int, default=64, help="windows of T tokens per inference forward pass")
    ap.add_argument("--infer-seconds", type=float, default=3, help="gputrain's inference run per round")
    ap.add_argument("--infer-steps", type=int, default=20, help="PyTorch's timed inference passes per round")
    ap.add_argument("--json", metavar="PATH", help="also write the table as JSON to PATH")
    args = ap.parse_args()
    try:
        torch_threads = [int(t) for t in args.torch_threads.split(",")]
    except ValueError:
        ap.error(f"--torch-threads {args.torch_threads}: a comma-separated list of thread counts, such as 1,2")
    if min(args.rounds, args.steps, args.threads, min(torch_threads), args.infer_batch, args.infer_steps) < 1 or \
            not args.infer_seconds > 0:
        ap.error("--rounds, --steps, --threads, --torch-threads, --infer-batch and --infer-steps must be >= 1, "
                 "--infer-seconds > 0")
    check_json_path(ap, args.json)
    data = shards()

    report = Report("gpt_vs_pytorch",
                    f"GPT of configs/gpt_bytes.yaml, batch {BATCH} x T {T}, AdamW + clipping, CPU; {args.steps} "
                    f"steps after {WARMUP} warm-up; inference {args.infer_batch} windows a pass, evaluation mode; "
                    "FLOPs per token from gputrain's MFU (training 3 x forward: 6N + attention; inference 1 x)",
                    args.rounds, {"train": "training", "infer": "inference"}, TARGETS)
    pythons = torch_pythons(report.notes)
    report.print_header()
    ours = report.add(Row("gputrain", "train", args.threads, "tokens", math.nan, ours=True))
    flops_seen = []

    def measure_ours():
        rate, flops = gputrain_rate(data, args.steps, args.threads, report.peak_rounds[-1])
        flops_seen.append(flops)
        return rate

    jobs = [(ours, measure_ours)]
    for py, name in pythons:
        for t in torch_threads:
            jobs.append((report.add(Row(name, "train", t, "tokens", math.nan)),
                         lambda py=py, t=t: torch_rate(py, data, args.steps, t)))
    jobs.append((report.add(Row("gputrain", "infer", args.threads, "tokens", math.nan, ours=True)),
                 lambda: gputrain_infer(data, args.infer_batch, args.threads, args.infer_seconds)))
    for py, name in pythons:
        for t in torch_threads:
            jobs.append((report.add(Row(name, "infer", t, "tokens", math.nan)),
                         lambda py=py, t=t: torch_rate(py, data, args.infer_steps, t, args.infer_batch, infer=True)))
    for r in range(args.rounds):
        report.peak_rounds.append(sgemm_peak())  # first: gputrain's run of this round logs its MFU against it
        for row, measure in rotated(jobs, r):
            row.rounds.append(measure())
        print(f"round {r + 1}/{args.rounds}: peak {report.peak_rounds[-1]:.1f} GFLOP/s, " +
              ", ".join(f"{row.mode} {row.label} {row.rounds[-1]:,.0f}" for row, _ in jobs), file=sys.stderr)

    # The model's count is the same in every round; the mfu's rounding to a double may differ in the last digits.
    flops = flops_seen[0]
    assert all(abs(f - flops) <= 1e-6 * flops for f in flops_seen), f"FLOPs per token differ by round: {flops_seen}"
    for row in report.rows:
        row.flops = flops if row.mode == "train" else flops / 3
    print(f"{flops * 1e-6:.3f} MFLOP per training token (gputrain's MFU figure), {flops / 3 * 1e-6:.3f} per "
          "inference token")
    report.print_table()
    if args.json:
        report.write_json(args.json, {"config": "configs/gpt_bytes.yaml", "batch": BATCH, "block": T,
                                      "steps": args.steps, "warmup": WARMUP, "train_flops_per_token": flops,
                                      "infer_batch": args.infer_batch, "infer_flops_per_token": flops / 3})


if __name__ == "__main__":
    main()
