#!/usr/bin/env python3
"""Training tokens/s of gputrain against PyTorch eager on the same GPT (configs/gpt_bytes.yaml: 4 layers, 4 heads,
128 channels, T = 64, batch 16, AdamW, gradient clipping) on the CPU, with the same threads.

    scripts/setup.sh && bench/torch_venv.sh && bench/gpt_vs_pytorch.py [--rounds 5] [--threads 2]

References: Debian's torch 1.13 (/usr/bin/python3) and the current torch from PyPI in bench/.venv (made by
bench/torch_venv.sh; skipped with a note when absent). Runs are interleaved over rounds and each figure is the median
of its rounds (this shared machine drifts by ±30 % between minutes). Both engines are timed the same way: 5 warm-up
steps, then --steps steps (gputrain's from the training clock of its metrics.jsonl rows). Data: the fortunes shards
of the README (tokenized here when missing).
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPUTRAIN = os.path.join(ROOT, "build", "gputrain")
CONFIG = os.path.join(ROOT, "configs", "gpt_bytes.yaml")
VENV_PY = os.path.join(ROOT, "bench", ".venv", "bin", "python")
T, BATCH = 64, 16


def shards():
    data = os.path.join(ROOT, "data", "fortunes")
    if not glob.glob(os.path.join(data, "train_*.bin")):
        files = sorted(f for f in glob.glob("/usr/share/games/fortunes/*")
                       if os.path.isfile(f) and not os.path.islink(f) and not f.endswith(".dat"))
        subprocess.run([GPUTRAIN, "tokenize", *files, "--out", data], check=True, stdout=subprocess.DEVNULL)
    return data


def gputrain_rate(data, steps, threads, warmup=5):
    """Training tokens/s over `steps` steps after `warmup` (as torch_gpt.py times PyTorch): from the metrics rows
    logged at the end of step `warmup` and of the last step (elapsed_s is the run's training clock)."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([GPUTRAIN, "train", CONFIG, "--device", "cpu", "--threads", str(threads), "--max-steps",
                        str(warmup + steps), "--quiet", "--set", f"data.train.path={data}/train_*.bin", "--set",
                        f"data.test.path={data}/val_*.bin", "--set", "train.eval_every=1000000", "--set",
                        "train.eval_tokens=64", "--set", f"train.log_every={warmup}", "--out",
                        os.path.join(out, "run")], check=True)
        with open(os.path.join(out, "run", "metrics.jsonl")) as f:
            rows = {r["step"]: r["elapsed_s"] for r in map(json.loads, f) if r.get("type") == "train"}
        last = max(rows)
        assert last == warmup + steps and warmup in rows, f"metrics.jsonl rows at steps {sorted(rows)}"
        return steps * BATCH * T / (rows[last] - rows[warmup])


def torch_rate(python, data, steps, threads):
    out = subprocess.run([python, os.path.join(ROOT, "bench", "torch_gpt.py"), "--data",
                          os.path.join(data, "train_000000.bin"), "--steps", str(steps), "--warmup", "5",
                          "--threads", str(threads), "--block", str(T), "--batch", str(BATCH)],
                         check=True, capture_output=True, text=True)
    r = json.loads(out.stdout)
    return r["tokens_per_sec"], r["torch"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    data = shards()
    pythons = {"/usr/bin/python3": "Debian"}
    if os.path.exists(VENV_PY):
        pythons[VENV_PY] = "PyPI"
    else:
        print("note: bench/.venv is missing (bench/torch_venv.sh makes it): no current-torch reference",
              file=sys.stderr)
    rows, names = {"gputrain": []}, {}
    for r in range(args.rounds):
        rows["gputrain"].append(gputrain_rate(data, args.steps, args.threads))
        for py, origin in pythons.items():
            rate, version = torch_rate(py, data, args.steps, args.threads)
            key = f"PyTorch {version} ({origin}) eager"
            rows.setdefault(key, []).append(rate)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rows.items()),
              file=sys.stderr)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"GPT of configs/gpt_bytes.yaml, batch {BATCH} x T {T}, {args.threads} threads, CPU; "
          f"median of {args.rounds} interleaved rounds")
    print(f"{'engine':<40}{'tokens/s':>12}")
    for k, v in med.items():
        print(f"{k:<40}{v:>12,.0f}")
    best = max(v for k, v in med.items() if k != "gputrain")
    print(f"ratio gputrain / fastest PyTorch: {med['gputrain'] / best:.2f}x (target >= 1.5x)")


if __name__ == "__main__":
    main()
