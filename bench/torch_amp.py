"""PyTorch's counterpart of gputrain's train.precision for the reference scripts (torch_reference.py, torch_gpt.py):
fp32 (PyTorch's default math modes), tf32 (TF32 matrix products and convolutions on GPUs; fp32 on the CPU), bf16 and
fp16 (torch.autocast around the forward pass and the loss, as PyTorch's AMP recipe has it; fp16 adds a GradScaler,
whose defaults are the semantics gputrain's train.loss_scale copies). fp16 autocast is GPU-only in PyTorch 1.13.
"""
import contextlib

import torch

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


class Amp:
    """The forward's context (`with amp.autocast():`) and the backward/step (`amp.step(loss, opt, clip)`)."""

    def __init__(self, precision, device):
        if precision not in PRECISIONS:
            raise SystemExit(f"--precision: {precision} is not one of {', '.join(PRECISIONS)}")
        if precision == "fp16" and device.type != "cuda":
            raise SystemExit("--precision fp16: PyTorch's fp16 autocast needs a GPU (use bf16 on the CPU)")
        self.device_type = device.type
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        tf32 = precision == "tf32"
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
        self.scaler = torch.cuda.amp.GradScaler() if precision == "fp16" else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def step(self, loss, opt, params=None, clip=None):
        """loss.backward() and opt.step(), through the scaler in fp16 (unscaled before clipping, as the recipe says)."""
        if self.scaler is None:
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(params, clip)
            opt.step()
            return
        self.scaler.scale(loss).backward()
        if clip is not None:
            self.scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, clip)
        self.scaler.step(opt)
        self.scaler.update()
