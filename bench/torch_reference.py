#!/usr/bin/env python3
"""PyTorch side of the throughput benchmarks: the same model, optimizer and batch as a gputrain config,
training loop only (data already in memory as tensors — on the GPU with --device cuda — shuffled per epoch), eager
mode, fp32 with PyTorch's default math modes (no TF32 for matrix products) unless --precision says otherwise
(tf32, or bf16/fp16 with torch.autocast and, for fp16, a GradScaler: bench/torch_amp.py).

Prints one JSON line: {"model", "threads", "device", "samples_per_sec", "steps", "seconds", "peak_mem_mib"}.
"""
import argparse
import json
import time

import torch
import torch.nn as nn

from torch_amp import PRECISIONS, Amp


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def cnn():
    # configs/fashion_mnist_cnn.yaml
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


MODELS = {"mlp": mlp, "cnn": cnn}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=sorted(MODELS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--samples", type=int, default=60000)
    ap.add_argument("--eval", action="store_true", help="inference throughput (no_grad, eval mode) instead")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--precision", default="fp32", choices=PRECISIONS)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    dev = torch.device(args.device)
    model = MODELS[args.model]().to(dev)
    amp = Amp(args.precision, dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    # Random pixels in [0, 1] stand in for Fashion-MNIST: throughput does not depend on the values.
    x_all = torch.rand(args.samples, 1, 28, 28, device=dev)
    y_all = torch.randint(0, 10, (args.samples,), device=dev)
    perm = torch.randperm(args.samples, device=dev)

    def step(i):
        idx = perm[(i * args.batch) % (args.samples - args.batch):][:args.batch]
        x, y = x_all[idx], y_all[idx]
        opt.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = loss_fn(model(x), y)
        amp.step(loss, opt)
        return loss

    if args.eval:
        model.eval()

        def step(i):  # noqa: F811 - inference replaces the training step
            idx = perm[(i * args.batch) % (args.samples - args.batch):][:args.batch]
            with torch.no_grad(), amp.autocast():
                return model(x_all[idx]).sum()

    for i in range(args.warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(i)
    loss.item()  # waits for the device
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else None
    print(json.dumps({"model": args.model, "threads": args.threads, "device": args.device,
                      "samples_per_sec": args.steps * args.batch / dt, "steps": args.steps, "seconds": dt,
                      "peak_mem_mib": peak, "torch": torch.__version__, "precision": args.precision}))


if __name__ == "__main__":
    main()
