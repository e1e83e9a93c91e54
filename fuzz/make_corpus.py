#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target into fuzz/corpus/<target>/: tiny valid files, one per feature the
reader has (gzip, header versions, dtypes, options). Rerun after changing a format; the output is committed.
Inputs that once crashed a target are kept beside them as regress-<what> (written by hand, not by this script)."""
import gzip
import json
import pathlib
import struct
import zlib

root = pathlib.Path(__file__).resolve().parent
corpus = root / "corpus"


def put(target, name, data):
    d = corpus / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def two(a, b):
    """Two files in one input, as fuzz_input.h's split_two reads them."""
    return struct.pack("<H", len(a)) + a + b


def idx(dims, data):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data)


def npy(descr, shape, payload, version=1):
    shape_text = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}"
    pre = 10 if version == 1 else 12
    header += " " * ((-(pre + len(header) + 1)) % 64) + "\n"
    size = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + size + header.encode("latin1") + payload


def safetensors(tensors, metadata=None):
    header, blob = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(payload)]}
        blob += payload
    text = json.dumps(header)
    text += " " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text.encode() + blob


# Inputs that once crashed a target (regress-*) stay; the seeds are rewritten.
for old in corpus.glob("*/*"):
    if not old.name.startswith("regress-"):
        old.unlink()

# Configs: the shipped ones and one of each data format (their data paths need not exist).
for cfg in sorted((root.parent / "configs").glob("*.yaml")):
    put("fuzz_config", cfg.name, cfg.read_text())
put("fuzz_config", "csv.yaml", """name: csv
data: {format: csv, train: {path: /tmp/x.csv}, label: y, header: auto, targets: values, batch_size: 2}
model: {layers: [{type: linear, out_features: 1}]}
loss: {type: mse}
optimizer: {type: adamw, lr: 0.001, betas: [0.9, 0.99], weight_decay: 0.01, amsgrad: true}
scheduler: {type: onecycle, max_lr: 0.01, warmup_steps: 2}
train: {epochs: 1, grad_clip: 1.0, accumulate: 2, eval_every: 3}
""")
put("fuzz_config", "npy_anchor.yaml", """name: &n npy
data:
  format: npy
  train: {inputs: /tmp/x.npy, targets: /tmp/y.npy}
  scale: 0.5
  augment: {random_crop: {padding: 2}, hflip: true}
model:
  layers:
    - {name: a, type: conv2d, out_channels: 4, kernel_size: 3}
    - {name: b, type: relu, inputs: [a]}
loss: {type: cross_entropy, label_smoothing: 0.1}
optimizer: {type: sgd, lr: 0.1, momentum: 0.9, nesterov: true}
scheduler: {type: cosine, t_max: 10, eta_min: 0.0}
device: [0, 1]
""")

# --set: assignments alone (on the target's base config), and assignments with a base config after an empty line.
put("fuzz_set", "lr", "optimizer.lr=0.5")
put("fuzz_set", "index", "model.layers[2].out_features=3\ntrain.epochs=1")
put("fuzz_set", "flow", "scheduler={type: cosine, t_max: 4}\ndata.input_shape=[2, 2]")
put("fuzz_set", "new_key", "train.max_steps=3\noptimizer.nesterov=true")
put("fuzz_set", "base", "a.b[1]=x\na.c={d: [1, 2]}\n\na: {b: [0, 1], c: 2}\n")
put("fuzz_set", "sizes-near-limits", "data.batch_size=16777216\nmodel.layers[0].out_features=16777216\n")
# Nested aliases ("billion laughs"): the config reader bounds alias expansion.
put("fuzz_config", "aliases", "a0: &a0 [x, x, x, x]\na1: &a1 [*a0, *a0, *a0, *a0]\nname: laughs\n")

# IDX: images [N, H, W] + labels [N], plain and gzip, and [N, C, H, W].
put("fuzz_idx", "plain", two(idx([2, 2, 3], range(12)), idx([2], [1, 0])))
put("fuzz_idx", "gzip", two(gzip.compress(idx([3, 1, 2], range(6)), mtime=0), gzip.compress(idx([3], [0, 2, 1]), mtime=0)))
put("fuzz_idx", "nchw", two(idx([1, 2, 1, 2], [9, 8, 7, 6]), idx([1], [4])))

# llm.c token shards: a block-size byte, then the shard (header magic 20240520, version 1, count; uint16 tokens).
def shard(tokens, magic=20240520, version=1, count=None):
    header = struct.pack("<3i", magic, version, len(tokens) if count is None else count) + bytes(1012)
    return header + struct.pack(f"<{len(tokens)}H", *tokens)


put("fuzz_tokens", "bytes", bytes([3]) + shard(list(b"hello, world")))
put("fuzz_tokens", "gpt2", bytes([1]) + shard([50256, 15496, 11, 995, 0, 50256]))
put("fuzz_tokens", "empty", bytes([0]) + shard([]))

# CSV: flag byte (header auto/true/false, bit 7: regression targets), the label setting, a newline, the file.
put("fuzz_csv", "header", b"\x00y\n" + b"a,b,y\n1,2,0\n3.5,-4e2,1\n")
put("fuzz_csv", "no_header", b"\x02-1\n" + b"1, 2, 3\n\n4,5,6\r\n")
put("fuzz_csv", "values", b"\x81\n" + b"x,t\n0.5,1.25\n1,2\n")

# NPY: inputs + targets, every dtype the reader takes, format versions 1 and 2.
f32 = struct.pack("<6f", *[0.5 * i for i in range(6)])
put("fuzz_npy", "f32_i64", two(npy("<f4", [3, 2], f32), npy("<i8", [3], struct.pack("<3q", 0, 2, 1))))
put("fuzz_npy", "u8_i32_v2", two(npy("|u1", [2, 2], bytes([0, 255, 7, 1]), 2), npy("<i4", [2], struct.pack("<2i", 1, 0))))
put("fuzz_npy", "f64_f32", two(npy("<f8", [2], struct.pack("<2d", 1.5, -2)), npy("<f4", [2, 1], struct.pack("<2f", 3, 4))))

# safetensors: each dtype the reader takes, metadata, an empty tensor list.
put("fuzz_safetensors", "f32_i32_meta", safetensors(
    {"layers.0.weight": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)), "step": ("I32", [1], struct.pack("<i", 7))},
    {"format": "pt"}))
put("fuzz_safetensors", "f64", safetensors({"b": ("F64", [3], struct.pack("<3d", 0.25, 0.5, 1))}))
put("fuzz_safetensors", "empty", safetensors({}))

# llm.c model checkpoints: the smallest GPT (1 layer, 1 head, 2 channels, vocabulary 3 padded to 4, 2 positions) in
# f32 (version 3) and bf16 (version 5), and one with two layers and two heads.
def llmc(version, T, V, L, NH, C, Vp):
    n = Vp * C + T * C + L * (2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C) + 2 * C
    header = struct.pack("<8i", 20240326, version, T, V, L, NH, C, Vp) + bytes(4 * 248)
    values = [((i * 37) % 17 - 8) / 16 for i in range(n)]
    if version == 3:
        return header + struct.pack(f"<{n}f", *values)
    return header + b"".join(struct.pack("<f", v)[2:] for v in values)  # bf16: the high half of each f32


put("fuzz_llmc", "f32", llmc(3, 2, 3, 1, 1, 2, 4))
put("fuzz_llmc", "bf16", llmc(5, 2, 3, 1, 1, 2, 4))
put("fuzz_llmc", "two_layers", llmc(3, 3, 5, 2, 2, 4, 8))

# state.json: a checkpoint's state as gputrain writes it (format 2), sealed with its state_crc32, and one whose
# checksum no longer matches a counter.
def sealed_state(**over):
    state = {"format": "gputrain.checkpoint", "format_version": 2, "gputrain_version": "0.1.0", "world_size": 1,
             "step": 1252, "epoch": 4, "position": {"micro_batches": 0, "batch_size": 64, "accumulate": 1},
             "rng": {"algorithm": "philox4x32-10", "streams": "counter-based"},
             "scheduler": {"step": 1252, "lr_scale": 1}, "loss_scaler": None,
             "optimizer": {"type": "adam", "steps_taken": 1252},
             "progress": {"epochs_done": 4, "train_samples": 80000, "epoch_samples": 0, "window_samples": 0,
                          "epoch_loss": 0, "window_loss": 0, "window_hits": 0, "final_train_loss": 0.1291,
                          "grad_norm": 0.4614, "train_seconds": 0.2838, "last_eval_step": 1252, "skips_in_row": 0},
             "metrics": {"test_loss": 0.0863, "test_accuracy": 0.963, "best_metric": "none", "best_value": None,
                         "best_step": -1, "jsonl_bytes": 11824},
             "config_hash": "fe12ccfe", "config": "name: synth\nseed: 7\n",
             "files": {"model.safetensors": {"bytes": 6832, "crc32": "77e59971"},
                       "optimizer.safetensors": {"bytes": 13544, "crc32": "6e2d00cb"}}}
    state.update(over)
    body = json.dumps(state)
    return body[:-1] + ', "state_crc32": "%08x"}\n' % zlib.crc32(body.encode())


put("fuzz_state", "state.json", sealed_state())
put("fuzz_state", "flipped_epoch", sealed_state().replace('"epoch": 4', '"epoch": 6'))

# Run-directory resolution: paths into the target's scratch tree (runs/r is a run directory).
for name, path in [("run", "runs/r"), ("metrics", "runs/r/metrics.jsonl"), ("ckpt", "runs/r/checkpoints/step-1"),
                   ("ckpt_weights", "runs/r/checkpoints/step-1/model.safetensors"), ("report", "runs/r/report.html"),
                   ("dotdot", "runs/r/checkpoints/../metrics.jsonl"), ("loose", "loose/w.safetensors"),
                   ("outside", "../../x")]:
    put("fuzz_run_dir", name, path)

# Images: one options byte (fuzz_image.cpp), then a PNG or JPEG. PNGs are built here (grey, RGB, grey with alpha,
# 16-bit, a palette); JPEGs with Pillow (python3-pil): baseline grey, progressive RGB, 4:2:0 subsampled.
def png(width, height, color_type, depth, raw_rows, extra_chunks=()):
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0)
    data = b"".join(b"\0" + row for row in raw_rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + b"".join(chunk(k, v) for k, v in extra_chunks) +
            chunk(b"IDAT", zlib.compress(data)) + chunk(b"IEND", b""))


put("fuzz_image", "png_grey", bytes([0]) + png(4, 3, 0, 8, [bytes(range(r * 4, r * 4 + 4)) for r in range(3)]))
put("fuzz_image", "png_rgb_resize", bytes([3]) + png(5, 6, 2, 8, [bytes((r * 40 + i) % 256 for i in range(15))
                                                                   for r in range(6)]))
put("fuzz_image", "png_grey_alpha_crop", bytes([7]) + png(9, 9, 4, 8, [bytes((r + i) % 256 for i in range(18))
                                                                       for r in range(9)]))
put("fuzz_image", "png_16bit", bytes([1]) + png(2, 2, 2, 16, [bytes(range(12)), bytes(range(12, 24))]))
put("fuzz_image", "png_palette", bytes([1]) + png(3, 2, 3, 8, [bytes([0, 1, 2]), bytes([2, 1, 0])],
                                                  [(b"PLTE", bytes([255, 0, 0, 0, 255, 0, 0, 0, 255]))]))
# Byte-level BPE tokenizer.json files, then the text to encode: the test fixtures and two tiny ones (GPT-2's byte
# alphabet and a few merges) with every pre-tokenizer, behavior and added-token option.
def byte_alphabet():
    keep = [b for b in range(256) if 0x21 <= b <= 0x7e or 0xa1 <= b <= 0xac or b >= 0xae]
    other = [b for b in range(256) if b not in keep]
    return {b: chr(b) if b in keep else chr(256 + other.index(b)) for b in range(256)}


def tiny_bpe(pre_tokenizer, normalizer=None, added=(), merges_as_pairs=False):
    vocab = {c: i for i, c in enumerate(byte_alphabet().values())}
    merges = [("t", "h"), ("th", "e"), ("\u0120", "th"), ("e", "r"), ("1", "2")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tokens = [{"id": len(vocab) + i, "content": c, "single_word": bool(sw), "lstrip": bool(ls), "rstrip": bool(rs),
               "normalized": bool(n), "special": bool(sp)} for i, (c, sw, ls, rs, n, sp) in enumerate(added)]
    return json.dumps({"version": "1.0", "added_tokens": tokens, "normalizer": normalizer,
                       "pre_tokenizer": pre_tokenizer, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
                       "model": {"type": "BPE", "vocab": vocab, "ignore_merges": not merges_as_pairs,
                                 "merges": [list(m) if merges_as_pairs else " ".join(m) for m in merges]}})


text = "the other 12 ther<|x|>  <mask> 😀 e\u0301\n\n".encode()
byte_level = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
put("fuzz_hf_bpe", "tiny_byte_level", two(tiny_bpe(byte_level, added=[("<|x|>", 0, 0, 0, 0, 1)], merges_as_pairs=True)
                                          .encode(), text))
put("fuzz_hf_bpe", "tiny_split", two(tiny_bpe(
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}|\\s+"}, "behavior": "MergedWithNext", "invert": False},
        {"type": "Split", "pattern": {"String": "e"}, "behavior": "Contiguous", "invert": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    normalizer={"type": "NFC"},
    added=[("<|x|>", 0, 1, 1, 0, 1), ("<mask>", 1, 0, 0, 1, 0)]).encode(), text))
for name in ("gpt2_style", "llama3_style"):
    fixture = (root.parent / "tests" / "reference" / "bpe" / f"{name}.tokenizer.json").read_bytes()
    put("fuzz_hf_bpe", name, two(fixture, "Hello<|endoftext|> world, it's 2026!\n\tcafé 😀".encode()))

try:
    import io
    from PIL import Image

    def jpeg(mode, size, **save):
        img = Image.new(mode, size)
        img.putdata([((x * 37 + y * 11) % 256 if mode == "L" else ((x * 37) % 256, (y * 53) % 256, (x * y) % 256))
                     for y in range(size[1]) for x in range(size[0])])
        out = io.BytesIO()
        img.save(out, "JPEG", **save)
        return out.getvalue()

    put("fuzz_image", "jpeg_grey", bytes([0]) + jpeg("L", (8, 8), quality=90))
    put("fuzz_image", "jpeg_rgb_progressive", bytes([3]) + jpeg("RGB", (16, 12), quality=75, progressive=True))
    put("fuzz_image", "jpeg_rgb_420_crop", bytes([7]) + jpeg("RGB", (10, 10), quality=50, subsampling=2))
except ImportError:
    print("make_corpus: no Pillow (apt install python3-pil): the fuzz_image JPEG seeds are not rewritten")
