#!/usr/bin/env bash
# Regenerates the generated blocks of docs/configuration.md from the binary: the layer reference (`gputrain layers`,
# between the layers:begin/end markers) and the config reference (`gputrain config reference`, between the
# config-reference:begin/end markers). tests/docs_current.py fails when they are stale.
# Usage: scripts/update_docs.sh [GPUTRAIN_BINARY]   (default build/gputrain)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/gputrain}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" layers >"$tmp/layers"
"$bin" config reference >"$tmp/config-reference"
python3 - docs/configuration.md "$tmp" <<'PY'
import re, sys
path, tmp = sys.argv[1], sys.argv[2]
text = open(path).read()
for name in ("layers", "config-reference"):
    body = open(f"{tmp}/{name}").read()
    pattern = re.compile(r"(<!-- %s:begin -->\n).*?(<!-- %s:end -->)" % (name, name), re.S)
    if not pattern.search(text):
        sys.exit(f"{path}: no <!-- {name}:begin --> ... <!-- {name}:end --> markers")
    text = pattern.sub(lambda m: m.group(1) + body + m.group(2), text)
open(path, "w").write(text)
PY
