#!/usr/bin/env python3
"""The GPT of configs/gpt_bytes.yaml in PyTorch eager, trained on windows of a token shard, timed like gputrain.

    python bench/torch_gpt.py --data DIR/train_000000.bin [--layers 4 --heads 4 --channels 128 --vocab 256]
                              [--block 64 --batch 16 --steps 40 --warmup 5 --threads 2]
                              [--vocab-rows 50304] [--attention auto|sdpa|manual] [--compile] [--preload]

GPT-2's math and initialisation (pre-norm blocks, tanh GELU, LayerNorm eps 1e-5, the lm head tied to the token
embedding, AdamW with
decay 0.1 on matrices only as llm.c), data drawn as random windows of block + 1 tokens from the shard (llm.c's
format: 256 int32 header, uint16 tokens). Attention is F.scaled_dot_product_attention(is_causal=True) where the
torch has it (2.x: its fused CPU kernel), else the masked softmax of nanoGPT (1.13). Prints one JSON line with
tokens_per_sec over the timed steps (after warm-up) and the torch version. --infer times forward passes instead, in
evaluation mode under torch.inference_mode() (no autograd records), over --batch random windows of the shard each.

For GPT-2 124M against configs/gpt2_124m.yaml (scripts/gpu_check_gpt2.sh): --vocab-rows gives the token embedding
more rows than the vocabulary (50304 for 50257, as that config pads it) while the tied head still predicts --vocab
tokens; --attention sdpa insists on F.scaled_dot_product_attention(is_causal=True) and manual on the masked softmax
(auto, the default, takes SDPA where the torch has it); --compile runs the model and its loss through torch.compile,
whose compilation falls in the warm-up steps, never the timed ones; --preload copies every step's windows to the
device before the first step, so that no step waits on a host-to-device copy (gputrain's loader copies while the
previous step runs). The JSON line then also names the attention, whether it was compiled, and the peak device memory
(torch.cuda.max_memory_allocated).
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
    def __init__(self, c, heads, block, sdpa):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.attn_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.proj = nn.Linear(4 * c, c)
        self.sdpa = sdpa
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
    def __init__(self, vocab, block, layers, heads, c, vocab_rows=None, sdpa=True):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(vocab_rows or vocab, c)
        self.wpe = nn.Embedding(block, c)
        self.h = nn.ModuleList(Block(c, heads, block, sdpa) for _ in range(layers))
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
        return self.ln_f(x) @ self.wte.weight[: self.vocab].t()  # the tied lm head (padding rows never predicted)


class WithLoss(nn.Module):
    """The model and its cross-entropy as one module: what --compile hands to torch.compile (as nanoGPT's model
    returns its loss), so that the compiled graph holds the loss too."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, win):
        logits = self.model(win[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), win[:, 1:].reshape(-1))


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
    ap.add_argument("--vocab-rows", type=int, default=None,
                    help="rows of the token embedding (default --vocab); the head predicts the first --vocab")
    ap.add_argument("--attention", default="auto", choices=("auto", "sdpa", "manual"),
                    help="sdpa: F.scaled_dot_product_attention(is_causal=True); manual: the masked softmax; "
                         "auto: sdpa where the torch has it")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model and its loss (compiled during the warm-up steps)")
    ap.add_argument("--preload", action="store_true",
                    help="copy every step's windows to the device before the first step")
    args = ap.parse_args()
    has_sdpa = hasattr(F, "scaled_dot_product_attention")
    if args.attention == "sdpa" and not has_sdpa:
        raise SystemExit(f"--attention sdpa: torch {torch.__version__} has no F.scaled_dot_product_attention")
    sdpa = args.attention == "sdpa" or (args.attention == "auto" and has_sdpa)
    if args.compile and not hasattr(torch, "compile"):
        raise SystemExit(f"--compile: torch {torch.__version__} has no torch.compile")
    if args.compile and args.infer:
        raise SystemExit("--compile times training steps; --infer is eager only")
    if args.compile and args.warmup < 1:
        raise SystemExit("--compile needs --warmup of at least 1: the compilation happens in the first step")
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    with open(args.data, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        assert header[0] == 20240520 and header[1] == 1, "not an llm.c token shard"
        tokens = np.frombuffer(f.read(), dtype=np.uint16)[: header[2]].astype(np.int64)
    dev = torch.device(args.device)
    model = GPT(args.vocab, args.block, args.layers, args.heads, args.channels, args.vocab_rows, sdpa).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    amp = Amp(args.precision, dev)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    rng = np.random.default_rng(1)
    t = args.block
    starts = rng.integers(0, (len(tokens) - 1) // t, size=(args.warmup + args.steps, args.batch)) * t
    t0 = None

    def windows(step, length):
        """Step's batch of windows of `length` tokens, on the device (from the preloaded copy with --preload)."""
        if preloaded is not None:
            return preloaded[step, :, :length]
        return torch.from_numpy(np.stack([tokens[s:s + length] for s in starts[step]])).to(dev)

    preloaded = None
    if args.preload:
        preloaded = torch.from_numpy(np.stack([np.stack([tokens[s:s + t + 1] for s in row]) for row in starts])).to(dev)
    if args.infer:
        model.eval()
        with torch.inference_mode(), amp.autocast():
            for step in range(args.warmup + args.steps):
                if step == args.warmup:
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                logits = model(windows(step, t))
            checksum = float(logits[-1, -1].sum())  # waits for the device
        seconds = time.perf_counter() - t0
        print(json.dumps({"tokens_per_sec": args.steps * args.batch * t / seconds, "checksum": checksum,
                          "torch": torch.__version__, "threads": args.threads, "precision": args.precision,
                          "mode": "infer"}))
        return
    train_loss = WithLoss(model)
    if args.compile:
        train_loss = torch.compile(train_loss)
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        win = windows(step, t + 1)
        with amp.autocast():
            loss = train_loss(win)
        opt.zero_grad(set_to_none=True)
        amp.step(loss, opt, model.parameters(), clip=1.0)
    final_loss = loss.item()  # waits for the device
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else None
    print(json.dumps({"tokens_per_sec": args.steps * args.batch * t / seconds, "loss": final_loss,
                      "torch": torch.__version__, "threads": args.threads, "peak_mem_mib": peak,
                      "precision": args.precision, "attention": "sdpa" if sdpa else "manual",
                      "compiled": args.compile, "preloaded": args.preload, "warmup": args.warmup,
                      "steps": args.steps, "timed_seconds": seconds}))


if __name__ == "__main__":
    main()
