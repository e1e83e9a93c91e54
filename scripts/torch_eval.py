#!/usr/bin/python3
"""Loads weights exported by gputrain into the equivalent PyTorch model and evaluates it on the config's test set.

    gputrain export runs/NAME/STAMP --to model.safetensors
    /usr/bin/python3 scripts/torch_eval.py model.safetensors

The model is rebuilt from the resolved config that `gputrain export` stores in the file's metadata (or from
--config, e.g. a run's config.resolved.yaml): every gputrain layer type maps to its torch.nn counterpart, named
inputs become a small graph, and each tensor is copied by name (layers.3.weight, branch1.running_mean, ...).
Only numpy and torch are needed to read the file. Prints one JSON line: {"samples", "test_loss", "test_accuracy"}.
"""
import argparse
import gzip
import json
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        arr = np.frombuffer(blob[base + begin:base + end], dtype=DTYPES[info["dtype"]])
        tensors[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return tensors, meta


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data[4 + 4 * ndim:], dtype=np.uint8).reshape(dims)


def test_set(cfg):
    """The test split as gputrain reads it: images get a channel axis, pixels times `scale` in float32."""
    d = cfg["data"]
    fmt = d["format"]
    if fmt == "idx":
        x = read_idx(d["test"]["images"])
        y = read_idx(d["test"]["labels"]).astype(np.int64)
        if x.ndim == 3:
            x = x[:, None, :, :]
    elif fmt == "npy":
        x = np.load(d["test"]["inputs"])
        y = np.load(d["test"]["targets"])
    else:
        sys.exit(f"torch_eval.py: data.format {fmt} is not supported here (idx and npy are)")
    x = x.astype(np.float32) * np.float32(d.get("scale", 1.0))
    return torch.from_numpy(x), torch.from_numpy(y)


class PositionalEmbedding(nn.Module):
    """gputrain's positional_embedding: x[:, t] + weight[t] for sequences of [T, C]."""

    def __init__(self, max_len, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max_len, dim))

    def forward(self, x):
        return x + self.weight[: x.shape[1]]


class Merge(nn.Module):
    def __init__(self, kind, dim=0):
        super().__init__()
        self.kind, self.dim = kind, dim

    def forward(self, *xs):
        if self.kind == "add":
            out = xs[0]
            for x in xs[1:]:
                out = out + x
            return out
        dim = self.dim + 1 if self.dim >= 0 else self.dim  # per-sample dim → batch dim
        return torch.cat(xs, dim)


def pair(v):
    return tuple(v) if isinstance(v, list) else (v, v)


def make_module(layer, name, tensors):
    t = layer["type"]
    w = tensors.get(layer["tied_to"] + ".weight" if "tied_to" in layer else name + ".weight")
    if t == "linear":
        return nn.Linear(w.shape[1], w.shape[0], bias=layer.get("bias", True))
    if t == "conv2d":
        return nn.Conv2d(w.shape[1] * layer.get("groups", 1), w.shape[0], pair(layer["kernel_size"]),
                         stride=pair(layer.get("stride", 1)), padding=pair(layer.get("padding", 0)),
                         dilation=pair(layer.get("dilation", 1)), groups=layer.get("groups", 1),
                         bias=layer.get("bias", True))
    if t in ("batchnorm1d", "batchnorm2d"):
        cls = nn.BatchNorm1d if t == "batchnorm1d" else nn.BatchNorm2d
        return cls(w.shape[0], eps=layer.get("eps", 1e-5), momentum=layer.get("momentum", 0.1))
    if t == "layernorm":
        return nn.LayerNorm(w.shape[0], eps=layer.get("eps", 1e-5))
    if t == "positional_embedding":
        return PositionalEmbedding(w.shape[0], w.shape[1])
    if t == "embedding":
        return nn.Embedding(w.shape[0], w.shape[1])
    if t in ("maxpool2d", "avgpool2d"):
        k = pair(layer["kernel_size"])
        args = dict(stride=pair(layer.get("stride", layer["kernel_size"])), padding=pair(layer.get("padding", 0)))
        return nn.MaxPool2d(k, **args) if t == "maxpool2d" else nn.AvgPool2d(k, count_include_pad=True, **args)
    if t == "gelu":
        return nn.GELU(approximate=layer.get("approximate", "none"))
    simple = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "flatten": nn.Flatten,
              "global_avgpool": lambda: nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())}
    if t in simple:
        return simple[t]()
    if t == "softmax":
        return nn.Softmax(dim=-1)
    if t == "dropout":
        return nn.Dropout(layer["p"])
    if t in ("add", "concat"):
        return Merge(t, layer.get("dim", 0))
    sys.exit(f"torch_eval.py: layer type {t} has no PyTorch mapping here")


class GraphModel(nn.Module):
    """gputrain's model graph: layers in config order, each fed by `inputs` (default: the layer before)."""

    def __init__(self, layers, tensors):
        super().__init__()
        self.order, self.inputs, self.tied = [], {}, {}
        self.mods = nn.ModuleDict()
        prev = "input"
        for i, layer in enumerate(layers):
            if isinstance(layer, str):
                layer = {"type": layer}
            name = layer.get("name", f"layers.{i}")
            self.order.append(name)
            self.inputs[name] = layer.get("inputs", [prev])
            self.mods[name.replace(".", "_")] = make_module(layer, name, tensors)
            if "tied_to" in layer:  # one parameter for both layers, as GPT-2's lm_head.weight = wte.weight
                self.tied[name] = layer["tied_to"]
            prev = name
        self.output = prev
        consumed = {i for ins in self.inputs.values() for i in ins}
        sinks = [n for n in self.order if n not in consumed]
        if sinks:
            self.output = sinks[-1]
        self.load(tensors)
        for name, owner in self.tied.items():
            self.mods[name.replace(".", "_")].weight = self.mods[owner.replace(".", "_")].weight

    def load(self, tensors):
        missing = set(tensors)
        for name in self.order:
            mod = self.mods[name.replace(".", "_")]
            for key, value in list(mod.state_dict().items()):
                full = f"{name}.{key}"
                if key == "num_batches_tracked" or (name in self.tied and key == "weight"):
                    continue
                if full not in tensors:
                    sys.exit(f"torch_eval.py: {full} is not in the weights file")
                if tuple(tensors[full].shape) != tuple(value.shape):
                    sys.exit(f"torch_eval.py: {full}: {tuple(tensors[full].shape)} in the file, "
                             f"{tuple(value.shape)} in the model")
                value.copy_(tensors[full])
                missing.discard(full)
        if missing:
            sys.exit(f"torch_eval.py: tensors in the file but not in the model: {sorted(missing)}")

    def forward(self, x):
        done = {"input": x}
        pending = list(self.order)
        while pending:  # inputs may name layers written later: run each once its inputs exist
            for name in pending:
                if all(i in done for i in self.inputs[name]):
                    done[name] = self.mods[name.replace(".", "_")](*[done[i] for i in self.inputs[name]])
                    pending.remove(name)
                    break
            else:
                sys.exit("torch_eval.py: the graph has a cycle or an unknown input")
        return done[self.output]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("weights", help="safetensors file written by gputrain export")
    ap.add_argument("--config", help="resolved config (default: the one stored in the file by gputrain export)")
    ap.add_argument("--batch", type=int, default=500)
    args = ap.parse_args()

    tensors, meta = read_safetensors(args.weights)
    if args.config:
        with open(args.config) as f:
            cfg = yaml.safe_load(f)
    elif "gputrain_config" in meta:
        cfg = yaml.safe_load(meta["gputrain_config"])
    else:
        sys.exit("torch_eval.py: no config in the file's metadata; pass --config RUN/config.resolved.yaml")
    torch.set_num_threads(1)
    model = GraphModel(cfg["model"]["layers"], tensors).eval()
    x, y = test_set(cfg)
    loss_cfg = cfg.get("loss", {"type": "cross_entropy"})
    loss_sum, hits = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(x), args.batch):
            out = model(x[i:i + args.batch])
            target = y[i:i + args.batch]
            if loss_cfg["type"] == "cross_entropy":
                loss = F.cross_entropy(out, target, reduction="sum",
                                       label_smoothing=loss_cfg.get("label_smoothing", 0.0))
                hits += int((out.argmax(1) == target).sum())
            else:
                loss = F.mse_loss(out, target.reshape(out.shape).float(), reduction="sum") / out[0].numel()
            loss_sum += float(loss)
    result = {"samples": len(x), "test_loss": loss_sum / len(x)}
    if loss_cfg["type"] == "cross_entropy":
        result["test_accuracy"] = hits / len(x)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
