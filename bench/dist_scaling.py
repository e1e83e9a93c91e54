#!/usr/bin/env python3
"""Data-parallel scaling on this machine: the same config on 1 rank and on N ranks, each rank with the same per-rank
batch and thread count (weak scaling), interleaved for several rounds; prints the medians. The N ranks are processes
under mpirun, processes over TCP with torchrun's variables, or worker threads of one process (`device: [cpu, …]`).

    bench/dist_scaling.py [--config configs/fashion_mnist_cnn.yaml] [--ranks 2] [--threads 1] [--steps 150]
                          [--launcher mpirun|tcp|threads]

Scaling efficiency = (N-rank samples/s) / (N x 1-rank samples/s); target >= 0.85 for 2 ranks of the CNN config.
Also prints what rank 0 logs about communication: bytes all-reduced per step, all-reduce time per step and the
share of it hidden behind the backward pass.
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


def run(config, ranks, threads, steps, out, launcher="mpirun", port=29611):
    cmd = [BINARY, "train", config, "--threads", str(threads), "--max-steps", str(steps), "--out", out,
           "--no-progress"]
    env = dict(os.environ)
    if ranks > 1 and launcher == "threads":
        # One process: its --threads are shared out between the workers.
        cmd[cmd.index("--threads") + 1] = str(threads * ranks)
        cmd += ["--device", "[" + ", ".join(["cpu"] * ranks) + "]"]
    if ranks > 1 and launcher == "mpirun":
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        cmd = ["mpirun", "-np", str(ranks), "--bind-to", "core"] + cmd
    if ranks > 1 and launcher == "tcp":
        procs = []
        for r in range(ranks):
            e = dict(env, RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(ranks),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode for p in procs):
            sys.exit(f"failed: {' '.join(cmd)} over TCP\n" + "\n".join(o[-2000:] for o in outs))
        log = subprocess.CompletedProcess(cmd, 0, outs[0], "")
    else:
        log = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if log.returncode != 0:
        sys.exit(f"failed ({log.returncode}): {' '.join(cmd)}\n{log.stdout[-2000:]}{log.stderr[-2000:]}")
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    result = {"samples_per_sec": summary["samples_per_sec"], "step_ms": 0.0}
    m = re.search(r"gradients: ([0-9.]+) MB all-reduced per step in (\d+) bucket", log.stdout)
    if m:
        result["mb_per_step"], result["buckets"] = float(m.group(1)), int(m.group(2))
    m = re.search(r"all-reduce: ([0-9.]+) ms per step, (-?[0-9]+)% of it hidden", log.stdout)
    if m:
        result["allreduce_ms"], result["hidden_pct"] = float(m.group(1)), float(m.group(2))
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "fashion_mnist_cnn.yaml"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--overlap", choices=["true", "false"], default="true", help="dist.overlap of the runs")
    ap.add_argument("--launcher", choices=["mpirun", "tcp", "threads"], default="mpirun",
                    help="how the N ranks run: mpirun processes, processes over TCP (torchrun's variables), or "
                         "worker threads of one process")
    args = ap.parse_args()
    one, many = [], []
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "config.yaml")  # the config with the dist section of this benchmark
        with open(args.config) as src, open(config, "w") as dst:
            dst.write(src.read() + f"\ndist: {{overlap: {args.overlap}}}\n")
        for r in range(args.rounds):
            one.append(run(config, 1, args.threads, args.steps, os.path.join(tmp, f"one{r}")))
            many.append(run(config, args.ranks, args.threads, args.steps, os.path.join(tmp, f"many{r}"),
                            args.launcher, 29611 + 7 * r))
    s1 = statistics.median(x["samples_per_sec"] for x in one)
    sn = statistics.median(x["samples_per_sec"] for x in many)
    batch = re.search(r"batch_size: (\d+)", open(args.config).read())
    batch = int(batch.group(1)) if batch else 0
    print(f"{os.path.basename(args.config)}: {args.steps} steps, batch {batch} per rank, {args.threads} thread(s) "
          f"per rank, {args.launcher}, dist.overlap {args.overlap}, median of {args.rounds} interleaved rounds")
    print(f"1 rank:  {s1:9,.0f} samples/s   {1e3 * batch / s1:7.1f} ms per step")
    print(f"{args.ranks} ranks: {sn:9,.0f} samples/s   {1e3 * batch * args.ranks / sn:7.1f} ms per step")
    hidden = statistics.median(x.get("hidden_pct", 0) for x in many)
    ms = statistics.median(x.get("allreduce_ms", 0) for x in many)
    print(f"all-reduce per step: {many[0].get('mb_per_step', 0):.2f} MB in {many[0].get('buckets', 0)} bucket(s), "
          f"{ms:.2f} ms, {hidden:.0f}% hidden behind backward")
    eff = sn / (args.ranks * s1)
    print(f"scaling efficiency: {eff:.2f} (target >= 0.85)")


if __name__ == "__main__":
    main()
