#!/usr/bin/env python3
"""The Fashion-MNIST speedrun: trains configs/fashion_mnist_speedrun.yaml once per seed and reports each
seed's test accuracy and wall time, their mean and spread, against the target (>= 93.0 % mean test accuracy in
<= 3 minutes of wall time on 2 cores).

    bench/speedrun.py [--seeds 5] [--first-seed 1] [--threads 2] [--config configs/fashion_mnist_speedrun.yaml]
                      [--set KEY=VALUE ...] [--json PATH]

Wall time is the whole `gputrain train` process as this script sees it (start, loading and decoding the data,
training, the one evaluation at the end, writing the run): what a user waits for. `train s` is gputrain's own clock
(summary.json's wall_seconds); `cpu s` is the process's CPU time, user + system over all its threads. The
seeds run one after the other and the target's times are an otherwise idle machine's, as `load` (the 1-minute load
average before and after each run) lets a reader check; on a shared machine `cpu s` / threads estimates the idle
wall time of the training (it is below it by whatever the threads wait for each other).
"""
import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import side_by_side  # noqa: E402  (the CPU line every benchmark prints)

ROOT = side_by_side.ROOT
GPUTRAIN = side_by_side.GPUTRAIN
TARGET_ACCURACY, TARGET_SECONDS = 0.930, 180.0


def run_seed(config, seed, threads, sets, out):
    cmd = [GPUTRAIN, "train", config, "--seed", str(seed), "--threads", str(threads), "--out", out, "--no-progress",
           "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    load_before = os.getloadavg()[0]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    if summary.get("test_accuracy") is None:
        sys.exit(f"{out}/summary.json has no test_accuracy: the config must have a test set")
    return {"seed": seed, "test_accuracy": summary["test_accuracy"], "wall_s": wall,
            "train_s": summary["wall_seconds"], "cpu_s": cpu, "samples_per_sec": summary["samples_per_sec"],
            "epochs": summary["epochs"], "load": [load_before, os.getloadavg()[0]]}


def spread(values):
    return {"mean": statistics.mean(values), "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "fashion_mnist_speedrun.yaml"))
    ap.add_argument("--seeds", type=int, default=5, help="how many seeds (default 5)")
    ap.add_argument("--first-seed", type=int, default=1, help="seeds first-seed .. first-seed + seeds - 1")
    ap.add_argument("--threads", type=int, default=2, help="gputrain --threads (default 2: the target's 2 cores)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to gputrain train --set (trials: --set train.epochs=3)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()
    if args.seeds < 1:
        ap.error("--seeds must be at least 1")
    side_by_side.check_json_path(ap, args.json)
    if not os.path.exists(GPUTRAIN):
        sys.exit(f"{GPUTRAIN} is missing: build it first (cmake --build build --target gputrain)")

    cpu = side_by_side.machine()
    print(cpu[0])
    for line in cpu[1:]:
        print(f"     {line}")
    print(f"{os.path.relpath(args.config, ROOT)}, {args.threads} threads"
          + (", --set " + " ".join(args.set) if args.set else ""))
    print(f"{'seed':>6}{'test acc':>10}{'wall s':>9}{'train s':>9}{'cpu s':>9}{'samples/s':>11}{'load':>12}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="speedrun-") as tmp:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            r = run_seed(args.config, seed, args.threads, args.set, os.path.join(tmp, f"seed{seed}"))
            rows.append(r)
            print(f"{seed:>6}{100 * r['test_accuracy']:>9.2f}%{r['wall_s']:>9.1f}{r['train_s']:>9.1f}{r['cpu_s']:>9.1f}"
                  f"{r['samples_per_sec']:>11,.0f}{r['load'][0]:>6.2f}{r['load'][1]:>6.2f}", flush=True)
    acc = spread([r["test_accuracy"] for r in rows])
    wall = spread([r["wall_s"] for r in rows])
    print(f"test accuracy: mean {100 * acc['mean']:.2f} %, stdev {100 * acc['stdev']:.2f}, "
          f"range {100 * acc['min']:.2f}-{100 * acc['max']:.2f} % (target: mean >= {100 * TARGET_ACCURACY:.1f} %)")
    print(f"wall time: mean {wall['mean']:.1f} s, stdev {wall['stdev']:.1f}, range {wall['min']:.1f}-{wall['max']:.1f} s"
          f" (target: <= {TARGET_SECONDS:.0f} s on an otherwise idle machine)")
    cpu_s = spread([r["cpu_s"] for r in rows])
    print(f"cpu time: mean {cpu_s['mean']:.1f} s, range {cpu_s['min']:.1f}-{cpu_s['max']:.1f} s "
          f"(/ {args.threads} threads: {cpu_s['mean'] / args.threads:.1f} s)")
    met = acc["mean"] >= TARGET_ACCURACY and wall["max"] <= TARGET_SECONDS
    print(f"target {'met' if met else 'missed'}")
    if args.json:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        doc = {"bench": "speedrun", "config": os.path.relpath(args.config, ROOT), "threads": args.threads,
               "sets": args.set, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "commit": commit or None, "machine": cpu, "seeds": rows, "test_accuracy": acc, "wall_s": wall, "cpu_s": cpu_s,
               "target": {"test_accuracy": TARGET_ACCURACY, "wall_s": TARGET_SECONDS}, "met": met}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
