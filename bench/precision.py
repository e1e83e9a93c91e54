#!/usr/bin/env python3
"""train.precision on this machine's CPU: fp32 against bf16, interleaved for several rounds; prints medians.

    /usr/bin/python3 bench/precision.py [--rounds 3] [--max-steps 40] [--threads 2] [--accuracy-steps 400]
                                        [--seeds 1 2] [--precisions fp32 bf16 [bf16-convert]] [--json out.json]

(a) Training throughput of configs/fashion_mnist_mlp.yaml, configs/fashion_mnist_cnn.yaml (samples/s) and
    configs/gpt_bytes.yaml (tokens/s) for --max-steps optimizer steps on the CPU in each precision, the runs of a round
    interleaved (config by config, precision by precision) so that a load that comes and goes touches all alike: the
    median of the logged windows after the first (warm-up) one per run, then the median over rounds. The test sets are
    left out, so no evaluation runs inside the timed steps. A CPU with AVX-512 BF16 multiplies bf16 natively
    (`gputrain devices` says so: the "bf16 products" line below); one without converts (gputrain logs which
    instruction set it lacks), and there the ratio is the slowdown, not a speed-up. `--precisions fp32 bf16
    bf16-convert` adds bf16 forced onto the conversion path (GPUTRAIN_CPU_BF16=convert) as a third column.
(b) Activation memory of each config in each precision from `gputrain check --json`: totals.activation_bytes
    (outputs, their gradients, what layers keep) and activation_dtype (what the outputs kept for backward are stored
    in; a shallow net keeps f32, see docs/mixed-precision.md), and total_bytes.
(c) Test accuracy of the CNN config after --accuracy-steps steps per seed in each precision (the same seeds, so the
    same initial weights and batches).

The CPU line is the one bench/side_by_side.py prints (`gputrain devices`: the bf16/fp16 instructions it has).
Needs data/fortunes (configs/gpt_bytes.yaml says how to make it) and Fashion-MNIST (scripts/setup.sh).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "build", "gputrain")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {"mlp": "configs/fashion_mnist_mlp.yaml", "cnn": "configs/fashion_mnist_cnn.yaml",
           "gpt": "configs/gpt_bytes.yaml"}


def variant(p):
    """(train.precision, environment) of a --precisions entry: bf16-convert is bf16 forced onto the conversion path
    (GPUTRAIN_CPU_BF16=convert) on a CPU that would multiply bf16 natively; the others are train.precision values."""
    if p == "bf16-convert":
        return "bf16", {**os.environ, "GPUTRAIN_CPU_BF16": "convert"}
    return p, None


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if p.returncode != 0:
        sys.exit(f"gputrain failed ({' '.join(cmd)}):\n{p.stdout}{p.stderr}")
    return p.stdout


def timing_config(tmp, name, max_steps):
    """The config without its test set (nothing evaluated inside the timed steps), on the CPU."""
    c = yaml.safe_load(open(os.path.join(ROOT, CONFIGS[name])))
    c["data"].pop("test", None)
    c["device"] = "cpu"
    c["train"] = {**c.get("train", {}), "epochs": 1000, "max_steps": max_steps, "log_every": max(1, max_steps // 8)}
    c["train"].pop("eval_every", None)
    c["train"].pop("eval_tokens", None)
    path = os.path.join(tmp, f"{name}.yaml")
    yaml.safe_dump(c, open(path, "w"), sort_keys=False)
    return path


def rate(run_dir):
    """(median rate of the logged windows after the first, unit): tokens/s for token data, else samples/s."""
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    rows = [r for r in rows if r.get("type") == "train" and r.get("samples_per_sec")]
    if not rows:
        sys.exit(f"no timed training rows in {run_dir}/metrics.jsonl")
    rows = rows[1:] if len(rows) > 1 else rows
    key = "tokens_per_sec" if rows[0].get("tokens_per_sec") else "samples_per_sec"
    return statistics.median(r[key] for r in rows), key.replace("_per_sec", "/s")


def check(name, p):
    precision, env = variant(p)
    out = run([BINARY, "check", CONFIGS[name], "--json", "--set", f"train.precision={precision}"], env)
    j = json.loads(out)
    return {"activation_bytes": j["totals"]["activation_bytes"], "activation_dtype": j["activation_dtype"],
            "total_bytes": j["totals"]["total_bytes"]}


def mib(b):
    return f"{b / 2**20:8.2f} MiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--accuracy-steps", type=int, default=400, help="0: skip (c)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--json", help="also write the medians here")
    args = ap.parse_args()
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        ap.error(f"--json {args.json}: its folder does not exist")
    from side_by_side import machine

    cpu = machine()
    print("\n".join(cpu), flush=True)
    result = {"cpu": cpu, "threads": args.threads, "max_steps": args.max_steps, "rounds": args.rounds,
              "throughput": {}, "memory": {}, "accuracy": {}}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: timing_config(tmp, name, args.max_steps) for name in args.configs}
        rates = {(n, p): [] for n in args.configs for p in args.precisions}
        unit = {}
        for r in range(args.rounds):
            line = []
            for name in args.configs:
                for p in args.precisions:
                    out = os.path.join(tmp, f"{name}_{p}_{r}")
                    precision, env = variant(p)
                    run([BINARY, "train", paths[name], "--threads", str(args.threads), "--out", out, "--quiet",
                         "--no-progress", "--set", f"train.precision={precision}"], env)
                    v, unit[name] = rate(out)
                    rates[(name, p)].append(v)
                    line.append(f"{name} {p} {v:.0f} {unit[name]}")
            print(f"round {r + 1}: " + ", ".join(line), flush=True)
        med = statistics.median
        print(f"\n(a) throughput, {args.max_steps} steps, --threads {args.threads}, medians of {args.rounds} "
              f"interleaved rounds:")
        base = args.precisions[0]
        for name in args.configs:
            cells = []
            for p in args.precisions:
                m = med(rates[(name, p)])
                result["throughput"][f"{name}/{p}"] = m
                ratio = "" if p == base else f" ({m / med(rates[(name, base)]):.2f}x {base})"
                cells.append(f"{p} {m:9.0f} {unit[name]}{ratio}")
            print(f"  {name:4} " + "   ".join(cells))
        print("(b) activation memory (gputrain check --json):")
        for name in args.configs:
            cells = []
            for p in args.precisions:
                m = check(name, p)
                result["memory"][f"{name}/{p}"] = m
                cells.append(f"{p} {mib(m['activation_bytes'])} ({m['activation_dtype']}), total {mib(m['total_bytes'])}")
            print(f"  {name:4} " + "   ".join(cells))
        if args.accuracy_steps > 0:
            print(f"(c) CNN test accuracy after {args.accuracy_steps} steps (full test set):", flush=True)
            for seed in args.seeds:
                cells = []
                for p in args.precisions:
                    out = os.path.join(tmp, f"acc_{seed}_{p}")
                    precision, env = variant(p)
                    run([BINARY, "train", CONFIGS["cnn"], "--threads", str(args.threads), "--out", out, "--quiet",
                         "--no-progress", "--device", "cpu", "--max-steps", str(args.accuracy_steps), "--set",
                         f"seed={seed}", "--set", f"train.precision={precision}"], env)
                    acc = json.load(open(os.path.join(out, "summary.json")))["test_accuracy"]
                    result["accuracy"][f"seed{seed}/{p}"] = acc
                    cells.append(f"{p} {acc:.4f}")
                print(f"  seed {seed}: " + "   ".join(cells), flush=True)
    if args.json:
        json.dump(result, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
