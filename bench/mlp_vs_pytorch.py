#!/usr/bin/env python3
"""Training throughput of gputrain against PyTorch on the Fashion-MNIST MLP (batch 128, CPU, training loop only).

gputrain runs with 2 threads; PyTorch (Debian's python3-torch, OpenBLAS) with 1 and 2 threads, and its best counts.
The runs are interleaved over several rounds and each side keeps its best round, so that noise from other work on
the machine hurts neither side more than the other. Prints a table and the ratio; also the achieved GFLOP/s beside
the machine's measured SGEMM rate.

    scripts/setup.sh --bench && bench/mlp_vs_pytorch.py [--rounds 3] [--steps 600]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
# FLOPs of one training sample: forward GEMMs, weight-gradient GEMMs, and input-gradient GEMMs for every layer but
# the first (its input is data and needs no gradient, so neither engine computes it).
DIMS = [784, 512, 256, 10]
FWD = sum(2 * a * b for a, b in zip(DIMS, DIMS[1:]))
TRAIN_FLOPS = 2 * FWD + sum(2 * a * b for a, b in list(zip(DIMS, DIMS[1:]))[1:])


def gputrain(steps, threads):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([os.path.join(BUILD, "gputrain"), "train", os.path.join(ROOT, "configs/fashion_mnist_mlp.yaml"),
                        "--device", "cpu", "--threads", str(threads), "--max-steps", str(steps), "--quiet",
                        "--out", out], check=True)
        with open(os.path.join(out, "summary.json")) as f:
            return json.load(f)["samples_per_sec"]


def torch_rate(steps, threads):
    out = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench/torch_reference.py"), "--model", "mlp",
                          "--threads", str(threads), "--steps", str(steps)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["samples_per_sec"]


def gemm_rate(threads):
    out = subprocess.run([os.path.join(BUILD, "bench_gemm_rate"), str(threads)], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout)["gflops"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()

    best = {"gputrain (2 threads)": 0.0, "pytorch (1 thread)": 0.0, "pytorch (2 threads)": 0.0}
    for r in range(args.rounds):
        best["gputrain (2 threads)"] = max(best["gputrain (2 threads)"], gputrain(args.steps, 2))
        best["pytorch (1 thread)"] = max(best["pytorch (1 thread)"], torch_rate(args.steps, 1))
        best["pytorch (2 threads)"] = max(best["pytorch (2 threads)"], torch_rate(args.steps, 2))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v:,.0f}" for k, v in best.items()), file=sys.stderr)
    sgemm = {t: gemm_rate(t) for t in (1, 2)}

    ours = best["gputrain (2 threads)"]
    ref = max(best["pytorch (1 thread)"], best["pytorch (2 threads)"])
    print(f"Fashion-MNIST MLP 784-512-256-10, batch 128, SGD momentum; {TRAIN_FLOPS / 1e6:.2f} MFLOP per training sample")
    print(f"{'engine':<24}{'samples/s':>12}{'GFLOP/s':>10}")
    for k, v in best.items():
        print(f"{k:<24}{v:>12,.0f}{v * TRAIN_FLOPS * 1e-9:>10.1f}")
    print(f"{'OpenBLAS SGEMM 2048³':<24}{'':>12}{sgemm[1]:>10.1f}  (1 thread)")
    print(f"{'':<24}{'':>12}{sgemm[2]:>10.1f}  (2 threads)")
    print(f"ratio gputrain / best PyTorch: {ours / ref:.2f}x (target >= 1.3x)")


if __name__ == "__main__":
    main()
