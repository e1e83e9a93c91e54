#!/usr/bin/env python3
"""Image-folder decoding rate: gputrain's `data.format: images` reader vs a PyTorch DataLoader over PIL on the same
folder, interleaved for several rounds; prints the medians in images/s. Also a cached read (data.cache).

    /usr/bin/python3 bench/image_decode.py [--images 10000] [--rounds 5] [--format png|jpg] [--threads 2] [--workers 2]

The folder holds the first --images Fashion-MNIST training images as <label>/<index>.<format> (grey 28 x 28),
written once into a temporary folder. gputrain's time is the decode line it logs ("images: N decoded from ... in
X s": listing, reading, decoding and scaling every file into the f32 tensor, on --threads OpenMP threads); the cached time
is the wall time of a whole `gputrain data inspect` process that maps the cache (start, listing the folder for the
key, mapping, and the statistics pass: an upper bound). PyTorch's time is one pass of a DataLoader (batch 256, --workers workers, and 0) whose Dataset opens
each file with PIL, converts it to a float tensor x 1/255, as torchvision's ImageFolder + ToTensor does.
"""
import argparse
import gzip
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "build", "gputrain")
FASHION = "/usr/share/datasets/fashion-mnist"


def write_folder(root, n, fmt):
    with gzip.open(f"{FASHION}/train-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)[:n]
    with gzip.open(f"{FASHION}/train-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    for i, (img, label) in enumerate(zip(images, labels)):
        d = os.path.join(root, str(label))
        os.makedirs(d, exist_ok=True)
        Image.fromarray(img, "L").save(os.path.join(d, f"{i:06d}.{fmt}"), **({"quality": 95} if fmt == "jpg" else {}))


class PilFolder(torch.utils.data.Dataset):
    def __init__(self, root, fmt):
        self.classes = sorted(os.listdir(root))
        self.files = [(os.path.join(root, c, f), i) for i, c in enumerate(self.classes)
                      for f in sorted(os.listdir(os.path.join(root, c))) if f.endswith(fmt)]

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        path, label = self.files[i]
        with Image.open(path) as img:
            x = torch.from_numpy(np.asarray(img.convert("L"), dtype=np.uint8).copy()).float().div_(255).unsqueeze(0)
        return x, label


def torch_pass(root, fmt, workers):
    start = time.perf_counter()
    ds = PilFolder(root, fmt)
    n = 0
    for x, _ in torch.utils.data.DataLoader(ds, batch_size=256, num_workers=workers):
        n += x.shape[0]
    return n / (time.perf_counter() - start)


def gputrain_pass(config, threads):
    start = time.perf_counter()
    out = subprocess.run([BINARY, "data", "inspect", config], capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    wall = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"gputrain failed:\n{out.stdout}{out.stderr}")
    log = out.stdout + out.stderr
    m = re.search(r"images: (\d+) decoded from .* in ([0-9.]+) s", log)
    if m:
        return int(m.group(1)) / float(m.group(2)), wall, "decoded"
    m = re.search(r"images: (\d+) from cache", log)
    if not m:
        sys.exit(f"no images line in gputrain's output:\n{log}")
    return int(m.group(1)) / wall, wall, "cached"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--format", choices=["png", "jpg"], default="png")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "train")
        write_folder(root, args.images, args.format)
        base = (f"name: bench\nseed: 1\ndevice: cpu\ndata:\n  format: images\n  train: {root}\n"
                f"  image: {{size: [28, 28], channels: 1}}\n  scale: 0.00392156862745098\n"
                f"model:\n  layers: [flatten, {{type: linear, out_features: 10}}]\nloss: cross_entropy\n"
                f"optimizer: {{type: sgd, lr: 0.1}}\n")
        plain, cached = os.path.join(tmp, "plain.yaml"), os.path.join(tmp, "cached.yaml")
        open(plain, "w").write(base)
        open(cached, "w").write(base.replace("  scale:", f"  cache: {tmp}/decoded.cache\n  scale:"))
        gputrain_pass(cached, args.threads)  # writes the cache
        rates = {"gputrain decode": [], "gputrain cached (whole process)": [],
                 f"torch DataLoader+PIL, {args.workers} workers": [], "torch DataLoader+PIL, 0 workers": []}
        for r in range(args.rounds):
            rates["gputrain decode"].append(gputrain_pass(plain, args.threads)[0])
            rate, _, how = gputrain_pass(cached, args.threads)
            assert how == "cached"
            rates["gputrain cached (whole process)"].append(rate)
            rates[f"torch DataLoader+PIL, {args.workers} workers"].append(torch_pass(root, args.format, args.workers))
            rates["torch DataLoader+PIL, 0 workers"].append(torch_pass(root, args.format, 0))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}/s" for k, v in rates.items()), flush=True)
        print(f"\n{args.images} {args.format} images (28 x 28 grey), {args.rounds} interleaved rounds, medians:")
        for k, v in rates.items():
            print(f"  {k:40s} {statistics.median(v):10.0f} images/s  (spread {min(v):.0f}..{max(v):.0f})")


if __name__ == "__main__":
    main()
