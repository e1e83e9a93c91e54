#!/usr/bin/env python3
"""Training and inference throughput of gputrain against PyTorch on the CPU, on the same model, batch and data size,
with the machine's measured SGEMM peak and each engine's share of it.

    scripts/setup.sh && bench/torch_venv.sh && bench/throughput_vs_pytorch.py --model mlp|cnn [--rounds 5]
                                                                             [--steps N] [--json PATH]

gputrain runs with 2 threads; PyTorch with 1 and 2 threads in each version found: Debian's python3-torch 1.13
(/usr/bin/python3) and the current one from PyPI in bench/.venv (made by bench/torch_venv.sh; skipped with a note
when absent). The ratio is gputrain's over the fastest of all PyTorch rows, each PyTorch at its best thread count, as
the speed targets below define it. Training throughput counts the training loop only (gputrain's summary.json; for
PyTorch, data already in memory). Each round measures the peak (side_by_side.py says what and why) and then runs
every engine once, starting one engine later each round; each figure is the median of its rounds: this shared
machine's speed drifts by ±30 % between minutes, and a median is not moved by one lucky or unlucky round.

FLOPs per sample are gputrain's count of the model's forward (`gputrain check --json`); a training sample counts 3 ×
the forward (forward, input gradients, weight gradients). Both engines skip the first layer's input gradient, so this
slightly overstates the training work: its GFLOP/s and share of the peak are upper bounds. --json PATH writes the
table (engine, rate, GFLOP/s, share of the peak, ratio, every round) for scripts that regenerate README figures.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from side_by_side import BUILD, GPUTRAIN, ROOT, Report, Row, check_json_path, rotated, sgemm_peak, torch_pythons

CONFIGS = {"mlp": "configs/fashion_mnist_mlp.yaml", "cnn": "configs/fashion_mnist_cnn.yaml"}
# The speed targets: training ≥ 2× (MLP) and ≥ 1.5× (CNN) the fastest PyTorch at ≥ 60 % (MLP) and ≥ 40 % (CNN) of the peak;
# inference ≥ 2× for each.
TARGETS = {"mlp": {"train": (2.0, 0.6), "infer": (2.0, None)}, "cnn": {"train": (1.5, 0.4), "infer": (2.0, None)}}
TORCH_THREADS = (1, 2)
GPUTRAIN_THREADS = 2


def forward_flops(config):
    """(forward FLOPs per sample, the config's batch) from gputrain's count of the model."""
    doc = json.loads(subprocess.run([GPUTRAIN, "check", config, "--json"], check=True, capture_output=True,
                                    text=True).stdout)
    return doc["totals"]["forward_flops"] / doc["batch"], doc["batch"]


def gputrain_train(config, steps, threads):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([GPUTRAIN, "train", config, "--device", "cpu", "--threads", str(threads), "--max-steps",
                        str(steps), "--quiet", "--set", "train.eval_every=1000000", "--out", out], check=True)
        with open(os.path.join(out, "summary.json")) as f:
            return json.load(f)["samples_per_sec"]


def gputrain_infer(config, batch, threads, seconds):
    out = subprocess.run([os.path.join(BUILD, "bench_infer_rate"), config, str(batch), str(threads), str(seconds)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["samples_per_sec"]


def torch_rate(python, model, steps, threads, batch, infer=False):
    cmd = [python, os.path.join(ROOT, "bench", "torch_reference.py"), "--model", model, "--threads", str(threads),
           "--steps", str(steps), "--batch", str(batch)]
    if infer:
        cmd += ["--eval", "--warmup", "3"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["samples_per_sec"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mlp", choices=sorted(CONFIGS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=0, help="training steps per run (default: 600 mlp, 120 cnn)")
    ap.add_argument("--infer-batch", type=int, default=1024)
    ap.add_argument("--infer-seconds", type=float, default=3, help="gputrain's inference run per round")
    ap.add_argument("--json", metavar="PATH", help="also write the table as JSON to PATH")
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 0:
        ap.error("--rounds must be >= 1 and --steps >= 0")
    check_json_path(ap, args.json)
    steps = args.steps or (600 if args.model == "mlp" else 120)
    infer_steps = max(4, steps // 30)
    config = os.path.join(ROOT, CONFIGS[args.model])
    fwd, batch = forward_flops(config)

    report = Report("throughput_vs_pytorch",
                    f"{args.model}: {CONFIGS[args.model]}, training batch {batch} ({steps} steps), inference batch "
                    f"{args.infer_batch}; {fwd * 1e-6:.3f} MFLOP forward per sample, training counted as 3 x forward "
                    "(an upper bound: both engines skip the first layer's input gradient)", args.rounds,
                    {"train": "training", "infer": "inference"}, TARGETS[args.model])
    pythons = torch_pythons(report.notes)
    report.print_header()

    jobs = []  # (row, function measuring one round)
    for mode, flops in (("train", 3 * fwd), ("infer", fwd)):
        row = report.add(Row("gputrain", mode, GPUTRAIN_THREADS, "samples", flops, ours=True))
        if mode == "train":
            jobs.append((row, lambda: gputrain_train(config, steps, GPUTRAIN_THREADS)))
        else:
            jobs.append((row, lambda: gputrain_infer(config, args.infer_batch, GPUTRAIN_THREADS, args.infer_seconds)))
        for py, name in pythons:
            for t in TORCH_THREADS:
                row = report.add(Row(name, mode, t, "samples", flops))
                if mode == "train":
                    jobs.append((row, lambda py=py, t=t: torch_rate(py, args.model, steps, t, batch)))
                else:
                    jobs.append((row, lambda py=py, t=t: torch_rate(py, args.model, infer_steps, t, args.infer_batch,
                                                                    infer=True)))
    for r in range(args.rounds):
        report.peak_rounds.append(sgemm_peak())
        for row, measure in rotated(jobs, r):
            row.rounds.append(measure())
        print(f"round {r + 1}/{args.rounds}: peak {report.peak_rounds[-1]:.1f} GFLOP/s, " +
              ", ".join(f"{row.mode} {row.label} {row.rounds[-1]:,.0f}" for row, _ in jobs), file=sys.stderr)

    report.print_table()
    if args.json:
        report.write_json(args.json, {"model": args.model, "config": CONFIGS[args.model], "train_batch": batch,
                                      "train_steps": steps, "infer_batch": args.infer_batch,
                                      "forward_flops_per_sample": fwd, "train_flops_per_sample": 3 * fwd})


if __name__ == "__main__":
    main()
