#!/usr/bin/env bash
# The size limits of lib/ and apps/: no source file (.cpp .h .cu .cuh) over 600 lines, no function over 150 (the
# house rules; a file past them is split by what its parts do, a function into named steps). Functions are found by
# Universal Ctags, whose end: field gives each one's last line. Prints every file and function past a limit with its
# size and fails; exit 77 (ctest's skip) when Universal Ctags is not installed.
# Usage: scripts/check_sizes.sh [SOURCE_DIR]   (ctest runs it as source_sizes)
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
max_file_lines=600
max_function_lines=150

if ! ctags --version 2>/dev/null | grep -q "Universal Ctags"; then
  echo "check_sizes: SKIPPED: Universal Ctags is not installed (apt install universal-ctags); nothing was checked"
  exit 77
fi

status=0
while IFS= read -r -d '' file; do
  lines=$(wc -l < "$file")
  if ((lines > max_file_lines)); then
    echo "$file: $lines lines (at most $max_file_lines: split it by what its parts do)"
    status=1
  fi
done < <(find lib apps -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0 | sort -z)

# One tag per function definition: NAME <tab> FILE <tab> PATTERN;" <tab> f <tab> line:N ... end:M.
long_functions=$(ctags -R --sort=no --fields=+ne --c++-kinds=f --languages=C++ --langmap=C++:+.cu.cuh -f - lib apps |
  awk -F'\t' -v max="$max_function_lines" '{
    line = ""; end = ""
    for (i = 4; i <= NF; ++i) {
      if ($i ~ /^line:[0-9]+$/) line = substr($i, 6)
      else if ($i ~ /^end:[0-9]+$/) end = substr($i, 5)
    }
    if (line != "" && end != "" && end - line + 1 > max)
      printf "%s:%d: %s is %d lines (at most %d: split it into named steps)\n", $2, line, $1, end - line + 1, max
  }' | sort -t: -k1,1 -k2,2n)
if [[ -n "$long_functions" ]]; then
  echo "$long_functions"
  status=1
fi

if ((status == 0)); then
  echo "check_sizes: every file in lib/ and apps/ is at most $max_file_lines lines, every function at most" \
    "$max_function_lines"
fi
exit "$status"
