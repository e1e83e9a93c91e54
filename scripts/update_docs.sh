#!/usr/bin/env bash
# Regenerates the README's layer reference (between the layers:begin/end markers) from the layer registry.
set -euo pipefail
cd "$(dirname "$0")/.."
table=$(build/gputrain layers)
python3 - "$table" <<'PY'
import re, sys
table = sys.argv[1] + "\n"
text = open("README.md").read()
new = re.sub(r"(<!-- layers:begin -->\n).*?(<!-- layers:end -->)", lambda m: m.group(1) + table + m.group(2), text,
             flags=re.S)
open("README.md", "w").write(new)
PY
