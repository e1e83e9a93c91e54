#!/usr/bin/env python3
"""Docs that cannot drift: fails, naming file:line, when README.md or docs/*.md says something the code no longer does.

  1. a generated block (<!-- NAME:begin --> ... <!-- NAME:end -->) differs from what the binary prints now
     (layers: `gputrain layers`, config-reference: `gputrain config reference`; scripts/update_docs.sh rewrites them);
  2. a `gputrain ...` command in a fenced shell block does not parse: each is run with GPUTRAIN_PARSE_ONLY=1, which
     parses the command line (and a config's words) and runs nothing, so placeholders such as config.yaml are fine;
  3. the README is over 300 lines, or a page other than docs/gpu.md says what has or has not run on a GPU (that is
     said once, with dates, in docs/gpu.md);
  4. `gputrain config reference` lacks a row for a key that `gputrain config schema` lists (both are generated from
     the same tables, so a key missing from one is a bug in its generator).

Usage: docs_current.py GPUTRAIN_BINARY SOURCE_DIR
"""
import json
import os
import re
import shlex
import subprocess
import sys

README_MAX_LINES = 300
GENERATED = {"layers": ["layers"], "config-reference": ["config", "reference"]}
SHELL_BLOCKS = {"sh", "bash", "shell", "console", "zsh"}
# Sentences that say what ran (or did not run) on a GPU; docs/gpu.md alone may say them.
GPU_CLAIMS = [
    r"\bran on (a|an|the|one|two) (GPU|H100|H200|A100|NVIDIA)",
    r"\b(has|have|had)( not| never)?( yet)?( been)? (run|tested|trained) on (a|an|the|any|two|several) GPU",
    r"\bno GPU (was|were|is) (available|lent)",
    r"\b(not|never) (been )?run on a GPU",
    r"\bon an H(100|200)\b",
    r"\bGPUs? (was|were|been|is) lent\b",
    r"\b(first|second|third|next) GPU run\b",
    r"\bcompiled but (has )?not run\b",
    r"\bskipped here, no GPU\b",
]
GPU_PAGE = os.path.join("docs", "gpu.md")
# In a block that is not marked as shell, a line typed without a prompt: it starts with the program or a launcher
# (after VAR=value assignments).
LAUNCH = re.compile(r"^(\w+=\S*\s+)*(\S*/)?(gputrain|mpirun|mpiexec|srun|torchrun|nsys)\s+(?![\w-]+:(\s|$))")
# $(...) and `...`: the words a shell would put there, which parse-only need not know.
SUBSTITUTION = re.compile(r"\$\((?:[^()]|\([^()]*\))*\)|`[^`]*`")


def doc_files(src):
    files = ["README.md"]
    docs = os.path.join(src, "docs")
    files += sorted(os.path.join("docs", f) for f in os.listdir(docs) if f.endswith(".md"))
    return files


def generated_spans(lines):
    """(name, first line index, end marker index) of each generated block."""
    spans, open_block = [], None
    for i, line in enumerate(lines):
        m = re.match(r"<!-- ([\w-]+):(begin|end) -->\s*$", line)
        if not m:
            continue
        if m.group(2) == "begin":
            open_block = (m.group(1), i)
        elif open_block and open_block[0] == m.group(1):
            spans.append((m.group(1), open_block[1], i))
            open_block = None
    return spans


def check_generated(binary, path, lines, failures):
    for name, begin, end in generated_spans(lines):
        if name not in GENERATED:
            failures.append(f"{path}:{begin + 1}: unknown generated block {name!r} (known: {', '.join(GENERATED)})")
            continue
        now = subprocess.run([binary] + GENERATED[name], capture_output=True, text=True, check=True).stdout
        if "".join(lines[begin + 1 : end]) != now:
            failures.append(
                f"{path}:{begin + 1}: the {name} block differs from `gputrain {' '.join(GENERATED[name])}`; "
                "run scripts/update_docs.sh"
            )


def schema_keys(node, out):
    """Every key name the JSON Schema's objects list (properties, the variants' then branches, alternatives), the
    layer list's $defs left out: the layer reference covers those."""
    if isinstance(node, dict):
        for name, sub in node.get("properties", {}).items():
            out.add(name)
            schema_keys(sub, out)
        for k, v in node.items():
            if k not in ("properties", "$defs"):
                schema_keys(v, out)
    elif isinstance(node, list):
        for v in node:
            schema_keys(v, out)
    return out


def check_reference_covers_schema(binary, failures):
    """The Markdown reference and the JSON Schema come from the same tables: a key in one is a row in the other."""
    schema = json.loads(subprocess.run([binary, "config", "schema"], capture_output=True, text=True, check=True).stdout)
    reference = subprocess.run([binary, "config", "reference"], capture_output=True, text=True, check=True).stdout
    rows = set(re.findall(r"^\| `([^`]+)` \|", reference, re.M))
    for key in sorted(schema_keys(schema, set()) - rows):
        failures.append(f"`gputrain config reference` has no row for the schema's key {key!r}")


def shell_lines(lines):
    """(line number, logical command line) of the fenced shell blocks, continuations joined; in a block of another
    kind only the lines typed after a `$ ` prompt count (the rest is output)."""
    out, fence, kind, pending = [], None, "", None
    for i, raw in enumerate(lines):
        line = raw.rstrip("\n")
        m = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", line)
        if m and (fence is None or m.group(2).startswith(fence)):
            if fence is None:
                fence, kind = m.group(2), m.group(3).lower()
            else:
                fence, pending = None, None
            continue
        if fence is None:
            continue
        text = line.strip()
        if pending is not None:
            start, joined = pending
            text = joined + " " + re.sub(r"^>\s", "", text)
        else:
            start = i + 1
            if text.startswith("$ "):
                text = text[2:]
            elif kind not in SHELL_BLOCKS and not LAUNCH.match(text):
                continue
        if text.endswith("\\"):
            pending = (start, text[:-1])
            continue
        pending = None
        out.append((start, text))
    return out


def gputrain_commands(text):
    """Each gputrain invocation in a shell line: the words after the program, up to a pipe, list or redirection."""
    text = SUBSTITUTION.sub("WORDS", text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:  # an unclosed quote: a loop body's fragment, nothing to run
        return []
    commands = []
    for k, tok in enumerate(tokens):
        if os.path.basename(tok) != "gputrain" or tok.startswith("-"):
            continue
        args = []
        for word in tokens[k + 1 :]:
            if re.fullmatch(r"[;&|<>()]+", word):
                if args and args[-1].isdigit():
                    args.pop()  # 2>&1: the descriptor belongs to the redirection
                break
            args.append(word)
        commands.append(args)
    return commands


def check_commands(binary, path, lines, failures):
    env = dict(os.environ, GPUTRAIN_PARSE_ONLY="1")
    checked = 0
    for number, text in shell_lines(lines):
        for args in gputrain_commands(text):
            if not args or any("…" in a for a in args):
                continue  # bare `gputrain`, or an elided command line
            run = subprocess.run([binary] + args, capture_output=True, text=True, env=env)
            checked += 1
            if run.returncode != 0:
                why = (run.stderr.strip() or run.stdout.strip()).splitlines()
                failures.append(f"{path}:{number}: `gputrain {shlex.join(args)}` does not parse: {why[0] if why else run.returncode}")
    return checked


def check_gpu_claims(path, lines, failures):
    if path == GPU_PAGE:
        return
    skip = set()
    for _, begin, end in generated_spans(lines):
        skip.update(range(begin, end + 1))  # generated from the code: fixed there, not here
    for i, line in enumerate(lines):
        if i in skip:
            continue
        for pattern in GPU_CLAIMS:
            m = re.search(pattern, line, re.I)
            if m and "gpu.md" not in line[m.end() : m.end() + 60]:  # "what has run on a GPU: [gpu.md](gpu.md)"
                failures.append(
                    f"{path}:{i + 1}: says what ran on a GPU ({m.group(0)!r}); that is said in docs/gpu.md alone: "
                    "link to it instead"
                )
                break


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    binary, src = os.path.abspath(sys.argv[1]), sys.argv[2]
    os.chdir(src)
    failures, checked = [], 0
    check_reference_covers_schema(binary, failures)
    for path in doc_files(src):
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
        check_generated(binary, path, lines, failures)
        checked += check_commands(binary, path, lines, failures)
        check_gpu_claims(path, lines, failures)
        if path == "README.md" and len(lines) > README_MAX_LINES:
            failures.append(f"README.md: {len(lines)} lines, more than {README_MAX_LINES}: move detail into docs/")
    for f in failures:
        print(f)
    print(f"docs_current: {checked} gputrain command lines parsed, {len(failures)} problem(s)")
    return 1 if failures or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
