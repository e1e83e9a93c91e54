#!/usr/bin/env python3
"""The input pipeline on this machine, interleaved for several rounds; prints medians and ratios.

    /usr/bin/python3 bench/data_pipeline.py [--config configs/fashion_mnist_resnet.yaml] [--max-steps 30]
                                            [--threads 2] [--images 10000] [--rounds 5]

(a) The augmented ResNet config (random crop + flip on every sample, on the host) for --max-steps optimizer steps on
    the CPU with `data.workers: 0` (the step's thread prepares each batch) and `data.workers: 1` (a loader thread
    prepares them ahead): the step time (batch / samples_per_sec of metrics.jsonl) and the share of it spent waiting
    for data (data_wait_ms / step time), medians over the logged windows after the first (warm-up) one, then medians
    over rounds. The test set is left out, so no evaluation runs.
(b) `data.format: images` with `data.cache` on a PNG folder of the first --images Fashion-MNIST training images
    (bench/image_decode.py's folder writer): a run whose cache is absent (decoding every file, writing the cache) vs
    the same run again (mapping the cache): the load time gputrain logs ("images: N decoded ... in X s" / the wall
    time of the run up to its first step is not logged, so the whole run's wall time is reported too), one epoch of
    a linear model, medians over rounds.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "build", "gputrain")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def train(config, out, threads, extra=()):
    start = time.perf_counter()
    cmd = [BINARY, "train", config, "--threads", str(threads), "--out", out, "--no-progress", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if p.returncode != 0:
        sys.exit(f"gputrain failed ({' '.join(cmd)}):\n{p.stdout}{p.stderr}")
    return p.stdout + p.stderr, wall


def step_rows(run, batch):
    """(step ms, data wait ms) of each logged training window after the first."""
    rows = []
    for line in open(os.path.join(run, "metrics.jsonl")):
        r = json.loads(line)
        if r.get("type") == "train" and r.get("samples_per_sec") and "data_wait_ms" in r:
            rows.append((1e3 * batch / r["samples_per_sec"], r["data_wait_ms"]))
    return rows[1:] if len(rows) > 1 else rows


def pipeline_configs(tmp, config, max_steps):
    c = yaml.safe_load(open(config))
    c["data"].pop("test", None)  # no evaluation inside the timed run
    c["device"] = "cpu"
    c["train"] = {"epochs": 1, "max_steps": max_steps, "log_every": max(1, max_steps // 6)}
    paths = {}
    for workers in (0, 1):
        c["data"]["workers"] = workers
        paths[workers] = os.path.join(tmp, f"workers{workers}.yaml")
        yaml.safe_dump(c, open(paths[workers], "w"), sort_keys=False)
    return paths, c["data"]["batch_size"]


def cache_config(tmp, root, cache):
    path = os.path.join(tmp, "images.yaml")
    open(path, "w").write(
        f"name: cache_bench\nseed: 1\ndevice: cpu\ndata:\n  format: images\n  train: {root}\n"
        f"  image: {{size: [28, 28], channels: 1}}\n  scale: 0.00392156862745098\n  cache: {cache}\n"
        f"  batch_size: 256\nmodel:\n  layers: [flatten, {{type: linear, out_features: 10}}]\nloss: cross_entropy\n"
        f"optimizer: {{type: sgd, lr: 0.1}}\ntrain: {{epochs: 1, log_every: 1000}}\n")
    return path


def load_seconds(log, wall):
    m = re.search(r"images: (\d+) decoded from .* in ([0-9.]+) s", log)
    if m:
        return float(m.group(2)), "decoded"
    if re.search(r"images: (\d+) from cache", log):
        return None, "cached"
    sys.exit(f"no images line in gputrain's output:\n{log}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "fashion_mnist_resnet.yaml"))
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from image_decode import write_folder

    with tempfile.TemporaryDirectory() as tmp:
        paths, batch = pipeline_configs(tmp, args.config, args.max_steps)
        root, cache = os.path.join(tmp, "png"), os.path.join(tmp, "decoded.cache")
        write_folder(root, args.images, "png")
        images = cache_config(tmp, root, cache)
        step = {0: [], 1: []}
        wait = {0: [], 1: []}
        share = {0: [], 1: []}
        first, second = [], []  # whole-run wall seconds: cache absent, cache mapped
        decode = []  # the decode time gputrain logs in the first run
        for r in range(args.rounds):
            for workers in (0, 1):
                run = os.path.join(tmp, f"run{r}_w{workers}")
                train(paths[workers], run, args.threads)
                rows = step_rows(run, batch)
                if not rows:
                    sys.exit(f"no training rows with data_wait_ms in {run}/metrics.jsonl")
                step[workers].append(statistics.median(s for s, _ in rows))
                wait[workers].append(statistics.median(w for _, w in rows))
                share[workers].append(statistics.median(w / s for s, w in rows))
            if os.path.exists(cache):
                os.remove(cache)
            log, wall = train(images, os.path.join(tmp, f"cache{r}_a"), args.threads)
            seconds, how = load_seconds(log, wall)
            assert how == "decoded", "the first run must decode"
            decode.append(seconds)
            first.append(wall)
            log, wall = train(images, os.path.join(tmp, f"cache{r}_b"), args.threads)
            assert load_seconds(log, wall)[1] == "cached", "the second run must map the cache"
            second.append(wall)
            print(f"round {r + 1}: step {step[0][-1]:.1f} ms ({100 * share[0][-1]:.2f} % waiting) with workers 0, "
                  f"{step[1][-1]:.1f} ms ({100 * share[1][-1]:.2f} %) with workers 1; images run "
                  f"{first[-1]:.2f} s decoding ({decode[-1]:.2f} s of it), {second[-1]:.2f} s from the cache",
                  flush=True)
        med = statistics.median
        print(f"\n(a) {os.path.basename(args.config)}, {args.max_steps} steps on the CPU, --threads {args.threads}, "
              f"{args.rounds} interleaved rounds, medians:")
        for w in (0, 1):
            print(f"  data.workers: {w}   step {med(step[w]):8.1f} ms   waiting for data {med(wait[w]):7.3f} ms "
                  f"= {100 * med(share[w]):6.2f} %")
        print(f"  step time ratio workers 0 / workers 1: {med(step[0]) / med(step[1]):.2f}x")
        print(f"(b) {args.images} PNG images, one epoch of a linear model, medians:")
        print(f"  cache absent (decode + write): run {med(first):.2f} s, of it decoding {med(decode):.2f} s")
        print(f"  cache mapped:                  run {med(second):.2f} s")
        print(f"  run time ratio absent / mapped: {med(first) / med(second):.2f}x")


if __name__ == "__main__":
    main()
