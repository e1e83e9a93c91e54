#!/usr/bin/env python3
"""Writes Fashion-MNIST as an image folder: OUT/train/<class>/<n>.png and OUT/test/<class>/<n>.png, the first
--per-class images of each class from Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist), for
configs/image_folder.yaml.

    /usr/bin/python3 scripts/fashion_folder.py data/fashion_folder [--per-class 600]
"""
import argparse
import gzip
import os
import struct
import sys

from PIL import Image

DATA = "/usr/share/datasets/fashion-mnist"
CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot"]


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return shape, data[4 + 4 * dims:]


def write_split(images, labels, out, per_class):
    (n, h, w), pixels = read_idx(images)
    _, ys = read_idx(labels)
    counts = [0] * len(CLASSES)
    for i in range(n):
        y = ys[i]
        if counts[y] >= per_class:
            continue
        folder = os.path.join(out, CLASSES[y])
        os.makedirs(folder, exist_ok=True)
        Image.frombytes("L", (w, h), pixels[i * h * w:(i + 1) * h * w]).save(os.path.join(folder, f"{i:05d}.png"))
        counts[y] += 1
    return sum(counts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--per-class", type=int, default=600)
    a = ap.parse_args()
    if os.path.exists(a.out) and os.listdir(a.out):
        sys.exit(f"{a.out}: exists and is not empty; choose a new folder")
    train = write_split(f"{DATA}/train-images-idx3-ubyte.gz", f"{DATA}/train-labels-idx1-ubyte.gz",
                        os.path.join(a.out, "train"), a.per_class)
    test = write_split(f"{DATA}/t10k-images-idx3-ubyte.gz", f"{DATA}/t10k-labels-idx1-ubyte.gz",
                       os.path.join(a.out, "test"), max(1, a.per_class // 6))
    print(f"{a.out}: {train} training and {test} test images in {len(CLASSES)} class folders")


if __name__ == "__main__":
    main()
