#!/usr/bin/env python3
"""The JSON Schema of `gputrain config schema` against real configs, with a validator gputrain does not share.

Every shipped config (configs/*.yaml) must validate, and so must the resolved config `gputrain config print` writes
for each section's variants (every optimizer, schedule and loss form, the nulls the resolved config writes). Each
broken config must be refused by the schema *and* by gputrain (exit 2), so the two agree on what a config is.

Usage: config_schema_test.py GPUTRAIN SOURCE_DIR. Exit 77 (ctest: skipped) with the reason when python3-jsonschema or
python3-yaml is missing.
"""
import copy
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    import jsonschema
except ImportError:
    print("SKIP: python3-jsonschema is not installed (scripts/setup.sh installs it)")
    sys.exit(77)
try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed (scripts/setup.sh installs it)")
    sys.exit(77)

gputrain, source = sys.argv[1], sys.argv[2]
failures = []


class Yaml12Loader(yaml.SafeLoader):
    """PyYAML reads YAML 1.1, where 1e-3 is a string; yaml-cpp and editors read it as the number it is."""


Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load_yaml(text):
    return yaml.load(text, Loader=Yaml12Loader)


def run(*args):
    return subprocess.run([gputrain, *args], capture_output=True, text=True, cwd=source)


out = run("config", "schema")
if out.returncode != 0:
    sys.exit(f"gputrain config schema: exit {out.returncode}: {out.stderr}")
schema = json.loads(out.stdout)
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)


def errors_of(config):
    return [f"{'.'.join(str(p) for p in e.absolute_path) or 'config'}: {e.message}" for e in validator.iter_errors(config)]


# 1. Every shipped config.
shipped = sorted(glob.glob(os.path.join(source, "configs", "*.yaml")))
if not shipped:
    failures.append("no configs/*.yaml found")
for path in shipped:
    with open(path) as f:
        errs = errors_of(load_yaml(f.read()))
    print(f"{os.path.relpath(path, source)}: {'valid' if not errs else 'INVALID'}")
    failures += [f"{path}: {e}" for e in errs]

# 2. Resolved configs: seed_linear (synthetic data, nothing to download) under each section's variants.
base = os.path.join(source, "configs", "seed_linear.yaml")
variants = [
    [],
    ["loss={type: mse}"],
    ["model.layers[0].out_features=3", "data.targets={classes: 3}", "loss={type: cross_entropy, label_smoothing: 0.1}"],
    ["model.layers[0].out_features=3", "data.targets={classes: 3}", "loss={type: cross_entropy, ignore_index: -1}"],
    ["optimizer={type: adam, lr: 1e-3}"],
    ["optimizer={type: adamw, lr: 3e-4, betas: [0.9, 0.95], amsgrad: true}"],
    ["optimizer={type: sgd, lr: 0.1, momentum: 0.9, nesterov: true}"],
    ["optimizer={type: adamw, lr: 3e-4, param_groups: [{params: ['*.bias'], weight_decay: 0}, "
     "{params: ['layers.*'], lr: 1e-3}]}"],
    ["+scheduler={type: step, step_size: 2, warmup_steps: 3}"],
    ["+scheduler={type: multistep, milestones: [2, 5]}"],
    ["+scheduler={type: exponential, gamma: 0.9}"],
    ["+scheduler={type: cosine, t_max: 4}"],
    ["+scheduler={type: linear, total_iters: 3}"],
    ["+scheduler={type: onecycle, max_lr: 1}"],
    ["train.eval_every=5", "+train.grad_clip={max_norm: 1}", "+train.profile={start_step: 2, steps: 3}"],
    ["+train.nonfinite=rollback", "+checkpoint={keep_best: test_loss, every_steps: 10}"],
    ["+logging={level: debug, every_steps: 2}", "+dist={sync_batchnorm: true}"],
    ["device=[cpu, cpu]"],
    # the keys whose null means something take it
    ["+checkpoint={keep_best: null}", "train.loss_scale=null", "+data.test_samples=4"],
    ["data.input_shape=[1, 4, 4]", "+data.augment={random_crop: {padding: 1}, hflip: true}",
     "model.layers=[flatten, {type: linear, out_features: 2}]"],
    ["model.layers=[{repeat: 2, name: h, layers: [{type: linear, out_features: 10}, relu]}, "
     "{type: linear, out_features: 2}]"],
]
for sets in variants:
    args = ["config", "print", base]
    for s in sets:
        args += ["--set", s]
    out = run(*args)
    label = "config print " + " ".join(sets)
    if out.returncode != 0:
        failures.append(f"{label}: exit {out.returncode}: {(out.stderr + out.stdout).strip()}")
        continue
    errs = errors_of(load_yaml(out.stdout))
    print(f"{label}: {'valid' if not errs else 'INVALID'}")
    failures += [f"{label}: {e}" for e in errs]


# 3. Broken configs: the schema and gputrain must both refuse each.
def set_path(config, path, value):
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    node = config
    for k in keys[:-1]:
        node = node[k]
    if value is DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value


DELETE = object()
with open(base) as f:
    seed_linear = load_yaml(f.read())
broken = [
    ("unknown top-level key", "optimiser", {"type": "sgd", "lr": 0.1}),
    ("unknown key in a section", "train.epoch", 3),
    ("unknown key in a nested map", "data.targets.shapes", [2]),
    ("a string for a size", "train.epochs", "five"),
    ("a list for a number", "optimizer.lr", [0.1]),
    ("unknown optimizer type", "optimizer.type", "adagrad"),
    ("unknown loss", "loss", "hinge"),
    ("unknown device", "device", "gpu"),
    ("negative batch size", "data.batch_size", -4),
    ("batch size past its limit", "data.batch_size", 1 << 25),
    ("zero learning rate", "optimizer.lr", 0),
    ("momentum above 1", "optimizer.momentum", 1.5),
    ("missing learning rate", "optimizer.lr", DELETE),
    ("missing data format", "data.format", DELETE),
    ("a key of another optimizer type", "optimizer", {"type": "adam", "lr": 0.1, "momentum": 0.9}),
    ("a schedule without its required key", "scheduler", {"type": "step"}),
    ("a param group without params", "optimizer.param_groups", [{"lr": 0.1}]),
    ("a param group with another key", "optimizer.param_groups", [{"params": ["*"], "momentum": 0.9}]),
    ("a param group's negative rate", "optimizer.param_groups", [{"params": ["*"], "lr": -1}]),
    ("synthetic targets with classes and shape", "data.targets", {"classes": 3, "shape": [2]}),
    ("unknown layer type", "model.layers.0.type", "linaer"),
    ("unknown layer argument", "model.layers.0.out_feature", 2),
    ("missing required layer argument", "model.layers.0.out_features", DELETE),
    ("a bare layer that needs arguments", "model.layers", ["linear"]),
    ("a repeat block with a type", "model.layers", [{"repeat": 2, "type": "relu", "layers": ["relu"]},
                                                    {"type": "linear", "out_features": 2}]),
    ("an empty layer list", "model.layers", []),
    ("a run name with a slash", "name", "a/b"),
    # null is no default (leave the key out for that), and a quoted number is a string, to both.
    ("null for a key with a default", "optimizer.momentum", None),
    ("null for a required key", "optimizer.lr", None),
    ("null for a section", "train", None),
    ("null for a layer argument", "model.layers.0.bias", None),
    ("a quoted number", "optimizer.lr", "0.1"),
    ("a quoted integer", "train.epochs", "3"),
    ("a quoted boolean", "data.shuffle", "false"),
]
with tempfile.TemporaryDirectory() as tmp:
    for i, (what, path, value) in enumerate(broken):
        config = copy.deepcopy(seed_linear)
        set_path(config, path, value)
        file = os.path.join(tmp, f"broken{i}.yaml")
        with open(file, "w") as f:
            yaml.safe_dump(config, f)
        refused_by_schema = bool(errors_of(config))
        out = run("config", "print", file)
        print(f"broken: {what}: schema {'refuses' if refused_by_schema else 'ACCEPTS'}, gputrain exit "
              f"{out.returncode}: {(out.stderr + out.stdout).strip()[:160]}")
        if not refused_by_schema:
            failures.append(f"the schema accepts a broken config: {what} ({path})")
        if out.returncode != 2:
            failures.append(f"gputrain config print exits {out.returncode}, not 2, for: {what} ({path})")

if failures:
    print("\n".join(["FAILED:"] + failures))
    sys.exit(1)
print(f"ok: {len(shipped)} shipped configs, {len(variants)} resolved configs valid; {len(broken)} broken ones refused")
