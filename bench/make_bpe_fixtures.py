#!/usr/bin/env python3
"""Writes the byte-level BPE fixtures of tests/test_hf_bpe.cpp into tests/reference/bpe/: two small tokenizer.json
files trained here with Hugging Face `tokenizers`, and expected.json, the ids that `tokenizers` and tiktoken (an
Encoding built from the same ranks, special tokens and pattern) give for a set of test strings, and the pieces
`tokenizers`' Split pre-tokenizer makes with each behavior. The tests compare
gputrain's encoder with these ids exactly; they cannot run either library themselves.

  gpt2_style:   ByteLevel pre-tokenizer (GPT-2's regex), ByteLevel decoder, <|endoftext|>, merges as [a, b] pairs.
  llama3_style: NFC, then Split(Llama 3's regex, Isolated) and ByteLevel(use_regex: false), ignore_merges, Llama 3's
                special tokens, merges as "a b" strings.
  options_style: NFC, two Splits (MergedWithNext; a String pattern, inverted, Contiguous) and ByteLevel with
                add_prefix_space; an added token with lstrip and rstrip, another with single_word and normalized.
                tiktoken has no such options: only `tokenizers`' ids are written for it.

Run in the venv (bench/torch_venv.sh --tokenizers): `$(bench/torch_venv.sh --tokenizers) bench/make_bpe_fixtures.py`.
The corpus is Debian's fortunes and the strings below (repeated), so a rerun trains the same merges as long as the
fortunes package and tokenizers' trainer stay the same; the test reads whatever is committed."""
import json
import pathlib
import random
import unicodedata

import tiktoken
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

root = pathlib.Path(__file__).resolve().parent.parent
out_dir = root / "tests" / "reference" / "bpe"
VOCAB = 640

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]

# Text the corpus and the tests share: languages, scripts, emoji, code, runs of punctuation, space and digits.
MIXED = [
    "The quick brown fox jumps over the lazy dog. It's 3:45pm; we'll see.",
    "Ünïcödé: café, naïve, Straße, Ærøskøbing, Œuvre, façade — “quoted” ‘text’…",
    "Русский текст, ελληνικά, עברית, العربية, हिन्दी, ไทย, 한국어, 日本語のテキスト, 中文文本。",
    "emoji 😀😃😄 👩‍👩‍👧‍👦 🇫🇷 👍🏽 ✨🚀🔥 ❤️",
    "int main(int argc, char** argv) {\n    return argc > 1 ? 0 : -1;\n}\n",
    "for (size_t i = 0; i < n; ++i) x[i] += y[i] * 2.5f;  // axpy",
    "def f(x):\n\treturn {'a': [1, 2, 3], \"b\": None}\n",
    "!!!??? ... --- === +++ *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}} <<< >>> /// \\\\\\ |||",
    "    leading spaces\n\n\n\t\ttabs and  double  spaces   trailing   \r\n",
    "digits 0123456789 3.14159265358979 1,000,000 2026-12-05 0x1F 1e-9 ４２",
    "I'm, you're, they've, she'll, he'd, it's, DON'T, CAN'T, We'Re",
]

SAMPLES = MIXED + [
    "",
    " ",
    "a",
    "hello<|endoftext|>world",
    "<|endoftext|><|endoftext|> <|endoftext|>\n",
    "<|begin_of_text|>Hi<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nok<|end_of_text|>",
    "<|endoftext",
    "e\u0301 vs \u00e9, A\u030a vs \u00c5, \u1100\u1161\u11a8 vs \uac01",
    " " * 300 + "x",
    "a" * 600,
    "ab" * 200 + " " + "1" * 100,
    "\n" * 20 + "x\n \n  \n",
    "tab\there\u3000ideographic space\u00a0nbsp\u2028line sep",
    "mixed: naïve café 😀 int x = 42; // ok?!",
    "Ǆǅǆ ǰ ſ ß ﬁ K Å",
    "The\u200bzero\u200cwidth\u200djoiners\ufeffbom",
    "a\u180eb c \u180e\u180e d\u0085e\u000bf",  # U+180E is not White_Space (PCRE2's \s has it)
]


# Random strings over the characters the options above look at (spaces, digits, 'e', the added tokens' text).
_rng = random.Random(20261205)
_PARTS = list("the r12 \n\t<>|xmask_é😀") + ["<|x|>", "<mask>", " \u0301", "\u3000"]
SAMPLES += ["".join(_rng.choice(_PARTS) for _ in range(_rng.randint(1, 30))) for _ in range(30)]


def corpus():
    texts = []
    fortunes = pathlib.Path("/usr/share/games/fortunes")
    for f in sorted(fortunes.iterdir()):
        if f.suffix == "" and f.is_file():
            texts.append(f.read_text(errors="replace"))
    texts += MIXED * 50
    return texts


def train():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    return json.loads(tok.to_str())


def llama3_style(spec):
    spec = json.loads(json.dumps(spec))
    first = len(spec["model"]["vocab"])
    spec["added_tokens"] = [{"id": first + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, c in enumerate(LLAMA3_SPECIAL)]
    spec["normalizer"] = {"type": "NFC"}
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    spec["model"]["ignore_merges"] = True
    spec["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    return spec


def options_style(spec):
    spec = json.loads(json.dumps(spec))
    first = len(spec["model"]["vocab"])
    spec["added_tokens"] += [
        {"id": first, "content": "<|x|>", "single_word": False, "lstrip": True, "rstrip": True, "normalized": False,
         "special": True},
        {"id": first + 1, "content": "<mask>", "single_word": True, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False}]
    spec["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}]}
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}|\s+"}, "behavior": "MergedWithNext", "invert": False},
        {"type": "Split", "pattern": {"String": "e"}, "behavior": "Contiguous", "invert": True},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    return spec


def byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tiktoken_of(spec, name, pattern):
    dec = byte_decoder()
    ranks = {bytes(dec[ch] for ch in token): i for token, i in spec["model"]["vocab"].items()
             if all(ch in dec for ch in token) and not any(a["id"] == i for a in spec["added_tokens"])}
    special = {a["content"]: a["id"] for a in spec["added_tokens"]}
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special)


def splits():
    """The pieces Split makes for each behavior, with and without invert."""
    cases = []
    for pattern, text in (("-", "the-final--countdown-"), (r"\s+", " a  b\u3000c \n"), ("x*", "axxb")):
        for behavior in ("removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"):
            for invert in (False, True):
                split = pre_tokenizers.Split(Regex(pattern), behavior=behavior, invert=invert)
                pieces = [p for p, _ in split.pre_tokenize_str(text)]
                cases.append({"pattern": pattern, "text": text, "behavior": behavior, "invert": invert,
                              "pieces": pieces})
    return cases


def main():
    out_dir.mkdir(parents=True, exist_ok=True)
    gpt2 = train()
    specs = {"gpt2_style": (gpt2, GPT2_PATTERN, False), "llama3_style": (llama3_style(gpt2), LLAMA3_PATTERN, True),
             "options_style": (options_style(gpt2), None, True)}
    expected = {"samples": SAMPLES, "splits": splits()}
    for name, (spec, pattern, nfc) in specs.items():
        text = json.dumps(spec, ensure_ascii=False, indent=None)
        (out_dir / f"{name}.tokenizer.json").write_text(text)
        hf = Tokenizer.from_str(text)
        hf_ids = [hf.encode(s, add_special_tokens=False).ids for s in SAMPLES]
        # What tokenizers decodes the ids to, where that is not the sample itself (NFC changed it): {index: text}.
        decoded = {str(i): d for i, d in enumerate(hf.decode(ids, skip_special_tokens=False) for ids in hf_ids)
                   if d != SAMPLES[i]}
        expected[name] = {"tokenizers": hf_ids, "decoded": decoded}
        if pattern is None:
            continue
        enc = tiktoken_of(spec, name, pattern)
        tk_ids = [enc.encode(unicodedata.normalize("NFC", s) if nfc else s, allowed_special="all") for s in SAMPLES]
        same = sum(a == b for a, b in zip(hf_ids, tk_ids))
        print(f"{name}: tokenizers and tiktoken agree on {same} of {len(SAMPLES)} samples")
        for s, a, b in zip(SAMPLES, hf_ids, tk_ids):
            if a != b:
                print(f"  differ on {s[:40]!r}: {a[:12]} vs {b[:12]}")
            assert hf.decode(a, skip_special_tokens=False) == (unicodedata.normalize("NFC", s) if nfc else s)
        expected[name]["tiktoken"] = tk_ids
    (out_dir / "expected.json").write_text(json.dumps(expected, ensure_ascii=True, separators=(",", ":")) + "\n")
    for f in sorted(out_dir.iterdir()):
        print(f"{f.relative_to(root)}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
