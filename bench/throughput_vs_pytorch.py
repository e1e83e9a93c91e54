#!/usr/bin/env python3
"""Training (and inference) throughput of gputrain against PyTorch on the CPU, on the same model, batch and data size.

    scripts/setup.sh && bench/throughput_vs_pytorch.py --model mlp|cnn [--rounds 5] [--steps N]

gputrain runs with 2 threads; PyTorch (Debian's python3-torch) with 1 and 2 threads and its best counts. Training
throughput counts the training loop only (gputrain's summary.json; for PyTorch, data already in memory). The runs are
interleaved over rounds and each figure is the median of its rounds: this shared machine's speed drifts by ±30 %
between minutes, and a median is not moved by one lucky or unlucky round. Prints a table with achieved GFLOP/s beside the machine's measured SGEMM rate.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
CONFIGS = {"mlp": "configs/fashion_mnist_mlp.yaml", "cnn": "configs/fashion_mnist_cnn.yaml"}
TARGETS = {"mlp": 1.3, "cnn": 1.5}


def forward_mflops(config):
    out = subprocess.run([os.path.join(BUILD, "gputrain"), "check", config], check=True, capture_output=True,
                         text=True).stdout
    return float(re.search(r"([0-9.]+) MFLOP forward per sample", out).group(1))


def gputrain_train(config, steps, threads):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([os.path.join(BUILD, "gputrain"), "train", config, "--device", "cpu", "--threads", str(threads),
                        "--max-steps", str(steps), "--quiet", "--set", "train.eval_every=1000000", "--out", out],
                       check=True)
        with open(os.path.join(out, "summary.json")) as f:
            return json.load(f)["samples_per_sec"]


def gputrain_infer(config, batch, threads):
    out = subprocess.run([os.path.join(BUILD, "bench_infer_rate"), config, str(batch), str(threads), "3"], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)["samples_per_sec"]


def torch_rate(model, steps, threads, batch=128, infer=False):
    cmd = ["/usr/bin/python3", os.path.join(ROOT, "bench/torch_reference.py"), "--model", model, "--threads",
           str(threads), "--steps", str(steps), "--batch", str(batch)]
    if infer:
        cmd += ["--eval", "--warmup", "3"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["samples_per_sec"]


def gemm_rate(threads):
    out = subprocess.run([os.path.join(BUILD, "bench_gemm_rate"), str(threads)], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout)["gflops"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=sorted(CONFIGS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=0, help="training steps per run (default: 600 mlp, 120 cnn)")
    ap.add_argument("--infer-batch", type=int, default=1024)
    args = ap.parse_args()
    steps = args.steps or (600 if args.model == "mlp" else 120)
    config = os.path.join(ROOT, CONFIGS[args.model])
    fwd = forward_mflops(config) * 1e6
    # Training ≈ 3 × forward (forward, input gradients, weight gradients); the first layer's input gradient is
    # skipped by both engines, so this slightly overstates the work: the GFLOP/s column is an upper bound.
    train_flops = 3 * fwd

    rows = {k: [] for k in ("gputrain train (2 threads)", "pytorch train (1 thread)", "pytorch train (2 threads)",
                             "gputrain infer (2 threads)", "pytorch infer (1 thread)", "pytorch infer (2 threads)")}
    for r in range(args.rounds):
        rows["gputrain train (2 threads)"].append(gputrain_train(config, steps, 2))
        for t in (1, 2):
            rows[f"pytorch train ({t} thread{'s' if t > 1 else ''})"].append(torch_rate(args.model, steps, t))
        rows["gputrain infer (2 threads)"].append(gputrain_infer(config, args.infer_batch, 2))
        for t in (1, 2):
            rows[f"pytorch infer ({t} thread{'s' if t > 1 else ''})"].append(
                torch_rate(args.model, max(4, steps // 30), t, args.infer_batch, infer=True))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rows.items()),
              file=sys.stderr)
    rows = {k: statistics.median(v) for k, v in rows.items()}
    sgemm = {t: gemm_rate(t) for t in (1, 2)}

    print(f"{args.model}: {CONFIGS[args.model]}, training batch 128, inference batch {args.infer_batch}; "
          f"{fwd / 1e6:.2f} MFLOP forward per sample")
    print(f"{'engine (median of ' + str(args.rounds) + ' rounds)':<28}{'samples/s':>12}{'GFLOP/s':>10}")
    for k, v in rows.items():
        flops = train_flops if k.split()[1] == "train" else fwd
        print(f"{k:<28}{v:>12,.0f}{v * flops * 1e-9:>10.1f}")
    print(f"{'OpenBLAS SGEMM 2048³':<28}{'':>12}{sgemm[1]:>10.1f}  (1 thread)")
    print(f"{'':<28}{'':>12}{sgemm[2]:>10.1f}  (2 threads)")
    ref_train = max(rows["pytorch train (1 thread)"], rows["pytorch train (2 threads)"])
    ref_infer = max(rows["pytorch infer (1 thread)"], rows["pytorch infer (2 threads)"])
    print(f"training ratio gputrain / best PyTorch: {rows['gputrain train (2 threads)'] / ref_train:.2f}x "
          f"(target >= {TARGETS[args.model]}x)")
    print(f"inference ratio gputrain / best PyTorch: {rows['gputrain infer (2 threads)'] / ref_infer:.2f}x")


if __name__ == "__main__":
    main()
