#!/usr/bin/env python3
"""The reference side of the llm.c interchange test (tests/test_llmc.cpp): a minimal GPT-2 in plain PyTorch (tanh
GELU, layer norm eps 1e-5, tied lm head over the first V rows of the padded [Vp, C] table, as llm.c computes it).

    torch_gpt2.py OUT_DIR [--layers 2 --heads 2 --channels 16 --vocab 60 --padded-vocab 64 --seq 8 --batch 2]

writes, from seeded random weights and tokens:
  model.bin    the weights as an llm.c checkpoint (version 3, f32)
  tokens.i32   the input tokens [B, T], int32;   targets.i32  the next tokens [B, T], int32
  logits.f32   the logits [B, T, V], f32 (the first V of the Vp computed, as llm.c's loss reads them)
  grads.bin    the gradients of the mean cross-entropy over all B·T tokens, as an llm.c checkpoint (version 3)
  loss.txt     that loss
"""
import argparse
import math
import pathlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MAGIC = 20240326


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.NH
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, NH, C, V, Vp, T):
        super().__init__()
        self.V = V
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight[: self.V].t()  # the tied head over the real vocabulary only

    def llmc_tensors(self, grad=False):
        """The 16 tensors in llm.c's order (train_gpt2.c's fill_in_parameter_sizes), weights [out, in]."""
        pick = (lambda p: p.grad) if grad else (lambda p: p.data)
        stack = lambda f: torch.stack([pick(f(b)) for b in self.h])
        return [pick(self.wte.weight), pick(self.wpe.weight),
                stack(lambda b: b.ln_1.weight), stack(lambda b: b.ln_1.bias),
                stack(lambda b: b.c_attn.weight), stack(lambda b: b.c_attn.bias),
                stack(lambda b: b.attn_proj.weight), stack(lambda b: b.attn_proj.bias),
                stack(lambda b: b.ln_2.weight), stack(lambda b: b.ln_2.bias),
                stack(lambda b: b.c_fc.weight), stack(lambda b: b.c_fc.bias),
                stack(lambda b: b.mlp_proj.weight), stack(lambda b: b.mlp_proj.bias),
                pick(self.ln_f.weight), pick(self.ln_f.bias)]


def write_llmc(path, sizes, tensors):
    header = np.zeros(256, dtype="<i4")
    header[:8] = [MAGIC, 3, sizes["T"], sizes["V"], sizes["L"], sizes["NH"], sizes["C"], sizes["Vp"]]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for t in tensors:
            f.write(t.detach().numpy().astype("<f4").tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    for name, default in [("layers", 2), ("heads", 2), ("channels", 16), ("vocab", 60), ("padded-vocab", 64),
                          ("seq", 8), ("batch", 2), ("seed", 1)]:
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    sizes = dict(L=a.layers, NH=a.heads, C=a.channels, V=a.vocab, Vp=a.padded_vocab, T=a.seq)
    torch.manual_seed(a.seed)
    model = GPT(a.layers, a.heads, a.channels, a.vocab, a.padded_vocab, a.seq)
    with torch.no_grad():  # GPT-2's scale of weights, with layer norms and biases away from their trivial values
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.02 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    write_llmc(out / "model.bin", sizes, model.llmc_tensors())
    seq = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
    tokens, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, a.vocab), targets.reshape(-1))
    loss.backward()
    tokens.numpy().astype("<i4").tofile(out / "tokens.i32")
    targets.numpy().astype("<i4").tofile(out / "targets.i32")
    logits.detach().numpy().astype("<f4").tofile(out / "logits.f32")
    write_llmc(out / "grads.bin", sizes, model.llmc_tensors(grad=True))
    (out / "loss.txt").write_text(f"{loss.item():.9g}\n")


if __name__ == "__main__":
    main()
