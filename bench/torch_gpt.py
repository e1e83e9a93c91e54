#!/usr/bin/env python3
"""The GPT of configs/gpt_bytes.yaml in PyTorch eager, trained on windows of a token shard, timed like gputrain.

    python bench/torch_gpt.py --data DIR/train_000000.bin [--layers 4 --heads 4 --channels 128 --vocab 256]
                              [--block 64 --batch 16 --steps 40 --warmup 5 --threads 2]

GPT-2's math and initialisation (pre-norm blocks, tanh GELU, LayerNorm eps 1e-5, the lm head tied to the token
embedding, AdamW with
decay 0.1 on matrices only as llm.c), data drawn as random windows of block + 1 tokens from the shard (llm.c's
format: 256 int32 header, uint16 tokens). Attention is F.scaled_dot_product_attention(is_causal=True) where the
torch has it (2.x: its fused CPU kernel), else the masked softmax of nanoGPT (1.13). Prints one JSON line with
tokens_per_sec over the timed steps (after warm-up) and the torch version. --infer times forward passes instead, in
evaluation mode under torch.inference_mode() (no autograd records), over --batch random windows of the shard each.
"""
import argparse
import json
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_amp import PRECISIONS, Amp


class Block(nn.Module):
    def __init__(self, c, heads, block):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.attn_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.proj = nn.Linear(4 * c, c)
        self.sdpa = hasattr(F, "scaled_dot_product_attention")
        if not self.sdpa:
            self.register_buffer("mask", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, c):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(block, c)
        self.h = nn.ModuleList(Block(c, heads, block) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        # GPT-2's initialisation, as llm.c's train_gpt2.py: N(0, 0.02) weights, zero biases, the residual
        # projections at 0.02 / sqrt(2 · layers).
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("attn_proj.weight", ".proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.h:
            x = blk(x)
        return self.ln_f(x) @ self.wte.weight.t()  # the tied lm head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--channels", type=int, default=128)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--infer", action="store_true", help="time forward passes in evaluation mode instead of training")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--precision", default="fp32", choices=PRECISIONS,
                    help="fp32: PyTorch's default math modes; tf32, bf16, fp16: bench/torch_amp.py")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    with open(args.data, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        assert header[0] == 20240520 and header[1] == 1, "not an llm.c token shard"
        tokens = np.frombuffer(f.read(), dtype=np.uint16)[: header[2]].astype(np.int64)
    dev = torch.device(args.device)
    model = GPT(args.vocab, args.block, args.layers, args.heads, args.channels).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    amp = Amp(args.precision, dev)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    rng = np.random.default_rng(1)
    t = args.block
    starts = rng.integers(0, (len(tokens) - 1) // t, size=(args.warmup + args.steps, args.batch)) * t
    t0 = None
    if args.infer:
        model.eval()
        with torch.inference_mode(), amp.autocast():
            for step in range(args.warmup + args.steps):
                if step == args.warmup:
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                win = torch.from_numpy(np.stack([tokens[s:s + t] for s in starts[step]])).to(dev)
                logits = model(win)
            checksum = float(logits[-1, -1].sum())  # waits for the device
        seconds = time.perf_counter() - t0
        print(json.dumps({"tokens_per_sec": args.steps * args.batch * t / seconds, "checksum": checksum,
                          "torch": torch.__version__, "threads": args.threads, "precision": args.precision,
                          "mode": "infer"}))
        return
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        win = torch.from_numpy(np.stack([tokens[s:s + t + 1] for s in starts[step]])).to(dev)
        with amp.autocast():
            logits = model(win[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, args.vocab), win[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        amp.step(loss, opt, model.parameters(), clip=1.0)
    final_loss = loss.item()  # waits for the device
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else None
    print(json.dumps({"tokens_per_sec": args.steps * args.batch * t / seconds, "loss": final_loss,
                      "torch": torch.__version__, "threads": args.threads, "peak_mem_mib": peak,
                      "precision": args.precision}))


if __name__ == "__main__":
    main()
