#!/usr/bin/env python3
"""Prints the reference numbers that tests/test_optim.cpp checks, computed with PyTorch's own optimizers and
schedulers (run with Debian's python3-torch: /usr/bin/python3 tests/reference/torch_refs.py). The test file holds
a copy of this output; rerun this to regenerate it."""
import torch


def optim_trace(make, steps=3):
    p = torch.nn.Parameter(torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64))
    opt = make([p])
    out = []
    for t in range(steps):
        p.grad = torch.tensor([0.5, -1.0 + t, 0.25 * t], dtype=torch.float64)
        opt.step()
        out.append(p.detach().tolist())
    return out


def lr_trace(make, steps):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    sched = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


print("adam", optim_trace(lambda ps: torch.optim.Adam(ps, lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)))
print("adamw", optim_trace(lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1)))
print("amsgrad", optim_trace(lambda ps: torch.optim.Adam(ps, lr=0.1, amsgrad=True)))
S = torch.optim.lr_scheduler
print("step", lr_trace(lambda o: S.StepLR(o, step_size=3, gamma=0.5), 8))
print("multistep", lr_trace(lambda o: S.MultiStepLR(o, milestones=[2, 5], gamma=0.1), 8))
print("exponential", lr_trace(lambda o: S.ExponentialLR(o, gamma=0.9), 5))
print("cosine", lr_trace(lambda o: S.CosineAnnealingLR(o, T_max=6, eta_min=0.01), 7))
print("linear", lr_trace(lambda o: S.LinearLR(o, start_factor=0.5, end_factor=0.1, total_iters=4), 6))
print("onecycle", lr_trace(lambda o: S.OneCycleLR(o, max_lr=1.0, total_steps=10, pct_start=0.3), 10))
