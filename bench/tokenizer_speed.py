#!/usr/bin/env python3
"""Encoding speed of gputrain's byte-level BPE against Hugging Face `tokenizers` and tiktoken, on the same BPE and
the same documents (Debian's fortunes, split at their "%" lines), each on the same number of threads, in interleaved
rounds; prints the medians, the ratios and whether the three give the same ids for every document.

    cmake --build build --target bench_tokenizer_speed
    $(bench/torch_venv.sh --tokenizers) bench/tokenizer_speed.py [--rounds 5] [--threads 2] [--vocab 16384]
                                                                  [--style gpt2|llama3]

The BPE is trained here with `tokenizers` on the same fortunes (gpt2: ByteLevel pre-tokenizer with GPT-2's regex;
llama3: NFC, Llama 3's Split regex, ByteLevel without regex, ignore_merges), saved as a tokenizer.json that
gputrain reads, and rebuilt from the same ranks as a tiktoken Encoding. gputrain runs as bench/tokenizer_speed.cpp
in its own process each round, encoding everything twice: the first pass starts with empty word caches ("cold"),
the second finds them filled ("warm"); `tokenizers` keeps its tokenizer (and cache) across rounds, tiktoken has
no word cache. Times are encoding only (not loading)."""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--vocab", type=int, default=16384)
ap.add_argument("--style", choices=("gpt2", "llama3"), default="gpt2")
ap.add_argument("--fortunes", default="/usr/share/games/fortunes")
args = ap.parse_args()
os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # tokenizers' thread pool, read when it first starts
os.environ["TOKENIZERS_PARALLELISM"] = "true"

import numpy as np  # noqa: E402
import tiktoken  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_bpe_fixtures import GPT2_PATTERN, LLAMA3_PATTERN, llama3_style, tiktoken_of  # noqa: E402

root = pathlib.Path(__file__).resolve().parent.parent
binary = root / "build" / "bench_tokenizer_speed"


def fortunes_text():
    parts = []
    for f in sorted(pathlib.Path(args.fortunes).iterdir()):
        if f.suffix == "" and f.is_file():
            text = f.read_text(errors="replace")
            parts.append(text if text.endswith("\n") else text + "\n")
    return "%\n".join(parts)


def documents(text):
    docs, doc = [], []
    for line in text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"):
        if line == "%":
            if doc:
                docs.append("".join(doc))
            doc = []
        else:
            doc.append(line + "\n")
    if doc:
        docs.append("".join(doc))
    return docs


def train(docs):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    spec = json.loads(tok.to_str())
    return (llama3_style(spec), LLAMA3_PATTERN) if args.style == "llama3" else (spec, GPT2_PATTERN)


def main():
    if not binary.exists():
        sys.exit(f"{binary} is missing: cmake --build build --target bench_tokenizer_speed")
    work = pathlib.Path(tempfile.mkdtemp(prefix="gt_tokspeed_"))
    try:
        run(work)
    finally:
        shutil.rmtree(work)


def run(work):
    text = fortunes_text()
    (work / "text.txt").write_text(text)
    docs = documents(text)
    nbytes = sum(len(d.encode()) for d in docs)
    spec, pattern = train(docs)
    (work / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    hf = Tokenizer.from_file(str(work / "tokenizer.json"))
    enc = tiktoken_of(spec, "bench", pattern)
    print(f"{len(docs)} documents, {nbytes / 1e6:.2f} MB; {args.style}-style BPE of {len(spec['model']['vocab'])} "
          f"tokens; {args.threads} threads; {os.cpu_count()} CPUs")
    times = {"gputrain cold": [], "gputrain warm": [], "tokenizers": [], "tiktoken": []}
    ids_path = work / "ids.bin"
    checked = False
    for r in range(args.rounds):
        cmd = [str(binary), str(work / "tokenizer.json"), str(work / "text.txt"), str(args.threads), "2", "%"]
        if not checked:
            cmd.append(str(ids_path))
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        times["gputrain cold"].append(out["pass_s"][0])
        times["gputrain warm"].append(out["pass_s"][1])
        t = time.perf_counter()
        hf_ids = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
        times["tokenizers"].append(time.perf_counter() - t)
        t = time.perf_counter()
        tk_ids = enc.encode_ordinary_batch(docs, num_threads=args.threads)
        times["tiktoken"].append(time.perf_counter() - t)
        if not checked:
            ours = np.fromfile(ids_path, dtype=np.uint32)
            flat_hf = np.fromiter((i for d in hf_ids for i in d), dtype=np.uint32)
            flat_tk = np.fromiter((i for d in tk_ids for i in d), dtype=np.uint32)
            print(f"ids: gputrain {len(ours)}, tokenizers {len(flat_hf)}, tiktoken {len(flat_tk)}; "
                  f"gputrain == tokenizers: {np.array_equal(ours, flat_hf)}, "
                  f"gputrain == tiktoken: {np.array_equal(ours, flat_tk)}")
            checked = True
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:>14}: median {v:.3f} s ({nbytes / v / 1e6:.1f} MB/s) over {len(times[k])} rounds")
    for ours in ("gputrain cold", "gputrain warm"):
        print(f"{ours}: {med['tokenizers'] / med[ours]:.2f}x tokenizers, {med['tiktoken'] / med[ours]:.2f}x tiktoken")


if __name__ == "__main__":
    main()
