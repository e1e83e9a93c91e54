#!/usr/bin/env python3
"""How long after exec a SIGTERM still takes the default action (exit 143) instead of gputrain's handler (exit 75).

gputrain catches SIGINT, SIGTERM and SIGUSR1 from the first instruction of main; before main, the dynamic loader
maps the libraries and their initialisers run (OpenBLAS's, CUDA's). This sends SIGTERM to `gputrain train` at delays
after its exec and reports, per delay, how many runs ended by the default action: the window is the delay up to which
some do.

    /usr/bin/python3 bench/signal_window.py [--binary build/gputrain] [--rounds 5] [--max-ms 200] [--step-ms 5]
"""
import argparse
import os
import signal
import subprocess
import tempfile
import time

CONFIG = """name: window
seed: 1
device: cpu
data: {format: synthetic, samples: 256, test_samples: 64, input_shape: [8], targets: {classes: 3}, batch_size: 32}
model: {layers: [{type: linear, out_features: 16}, relu, {type: linear, out_features: 3}]}
loss: cross_entropy
optimizer: {type: sgd, lr: 0.1}
train: {epochs: 100000}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default="build/gputrain")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-ms", type=float, default=200)
    ap.add_argument("--step-ms", type=float, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "c.yaml")
        with open(cfg, "w") as f:
            f.write(CONFIG)
        window = 0.0
        delay = 0.0
        print(f"{'delay ms':>8}  default action / runs")
        while delay <= a.max_ms:
            default = 0
            for r in range(a.rounds):
                out = os.path.join(tmp, f"run-{delay}-{r}")
                p = subprocess.Popen([a.binary, "train", cfg, "--out", out, "--no-progress", "--quiet"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                start = time.monotonic()
                while time.monotonic() - start < delay / 1000:
                    pass
                p.send_signal(signal.SIGTERM)
                code = p.wait()
                default += code == -signal.SIGTERM
            print(f"{delay:8.1f}  {default}/{a.rounds}")
            if default:
                window = delay
            delay += a.step_ms
        print(f"window: SIGTERM took the default action up to {window:.1f} ms after the process started")


if __name__ == "__main__":
    main()
