#!/usr/bin/env python3
"""What dist.zero saves: per-rank peak resident memory of an MLP trained with Adam (optimizer state about twice the
weights) under mpirun at N = 1, 2, 4 ranks (oversubscribed where the machine has fewer cores: memory does not care)
for dist.zero 0, 1 and 2, and the step time of each stage at 2 ranks; interleaved rounds, medians printed.

    bench/zero_memory.py [--width 2048] [--depth 3] [--steps 20] [--rounds 3] [--ranks 1,2,4] [--batch 32]
                         [--bucket-mb 25]

Stage 2 holds its chunk of every gradient bucket plus at most two buckets whole during the backward pass, so it saves
gradient memory only when the gradients span several buckets: the README's figures use many narrow layers and
--bucket-mb 4 (one layer per bucket).

Peak memory is each rank's VmHWM (the kernel's high-water mark of resident memory, as /proc/<pid>/status reports it),
read through getrusage(RUSAGE_CHILDREN).ru_maxrss by a wrapper around each rank after it exits, so the peak of the
last step and of the checkpoint at the end count too. Printed: the largest rank's value and the mean over ranks.
With N = 1 the zero key changes nothing (one rank keeps everything), so only zero 0 runs there.
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
BINARY = os.path.join(ROOT, "build", "gputrain")

# Runs one rank's command and prints its peak resident memory (KiB) on stderr as "zero_memory_hwm <rank> <kib>".
WRAPPER = """import os, resource, subprocess, sys
rc = subprocess.call(sys.argv[1:])
rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))
print(f"zero_memory_hwm {rank} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}", file=sys.stderr)
sys.exit(rc)
"""


def config_text(width, depth, batch, zero, samples, bucket_mb):
    # Just enough samples for the steps at the most ranks: the synthetic set is held in memory, and a large one would
    # hide the optimizer state.
    layers = "\n".join(f"    - {{type: linear, out_features: {width}}}\n    - relu" for _ in range(depth))
    return f"""name: zero_memory
seed: 1
device: cpu
data: {{format: synthetic, samples: {samples}, input_shape: [{width}], targets: {{classes: 10}}, batch_size: {batch}}}
model:
  layers:
{layers}
    - {{type: linear, out_features: 10}}
optimizer: {{type: adam, lr: 0.001}}
train: {{epochs: 1, log_every: 1000}}
dist: {{zero: {zero}, bucket_mb: {bucket_mb}}}
"""


def run(tmp, name, cfg, ranks, steps):
    config = os.path.join(tmp, name + ".yaml")
    with open(config, "w") as f:
        f.write(cfg)
    out = os.path.join(tmp, name)
    wrapper = os.path.join(tmp, "wrapper.py")
    with open(wrapper, "w") as f:
        f.write(WRAPPER)
    cmd = [sys.executable, wrapper, BINARY, "train", config, "--threads", "1", "--max-steps", str(steps), "--out", out,
           "--no-progress", "--quiet"]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe"] + cmd
    log = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if log.returncode != 0:
        sys.exit(f"failed ({log.returncode}): {' '.join(cmd)}\n{log.stdout[-2000:]}{log.stderr[-2000:]}")
    hwm = [int(k) for _, k in re.findall(r"zero_memory_hwm (\d+) (\d+)", log.stderr)]
    if len(hwm) != ranks:
        sys.exit(f"expected {ranks} memory reports, got {len(hwm)}:\n{log.stderr[-2000:]}")
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    return {"max_mib": max(hwm) / 1024, "mean_mib": statistics.mean(hwm) / 1024,
            "samples_per_sec": summary["samples_per_sec"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=3, help="hidden layers of `width` units")
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--bucket-mb", type=float, default=25, help="dist.bucket_mb (25: gputrain's default)")
    args = ap.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    cases = [(n, z) for n in ranks for z in ((0,) if n == 1 else (0, 1, 2))]
    results = {c: [] for c in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):  # interleaved: machine noise spreads over every case alike
            for n, z in cases:
                cfg = config_text(args.width, args.depth, args.batch, z, args.batch * max(ranks) * (args.steps + 1),
                                  args.bucket_mb)
                results[(n, z)].append(run(tmp, f"n{n}z{z}r{r}", cfg, n, args.steps))
    w, d = args.width, args.depth
    params = w * w * d + w * d + (w * 10 + 10)
    print(f"MLP {w}x{d} + head ({params / 1e6:.1f}M parameters, Adam state {8 * params / 2**20:.0f} MiB unsharded), "
          f"batch {args.batch} per rank, dist.bucket_mb {args.bucket_mb:g}, {args.steps} steps, mpirun, median of "
          f"{args.rounds} interleaved rounds")
    print(f"{'ranks':>5} {'zero':>4} {'peak RSS max rank':>18} {'mean over ranks':>16} {'ms per step':>12}")
    for n, z in cases:
        rs = results[(n, z)]
        mx = statistics.median(x["max_mib"] for x in rs)
        mean = statistics.median(x["mean_mib"] for x in rs)
        sps = statistics.median(x["samples_per_sec"] for x in rs)
        step = f"{1e3 * args.batch * n / sps:12.1f}" if n in (1, 2) else f"{'':>12}"
        print(f"{n:>5} {z:>4} {mx:14.1f} MiB {mean:12.1f} MiB {step}")


if __name__ == "__main__":
    main()
