#!/usr/bin/env bash
# Checks the size limits of the source tree: no tracked source file over 1,200 lines and no function over 200
# lines (lizard's length: first to last line). Prints each violation; exits 1 if there is any.
# Usage: bash tools/check_sizes.sh   (installs lizard from PyPI if it is missing)
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_FILE_LINES=1200
MAX_FUNCTION_LINES=200
if ! python3 -c 'import lizard' 2>/dev/null; then
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check lizard
fi
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cc' '*.cu' '*.cuh' '*.c' '*.py' | grep -v '^tests/fixtures/')
bad=0
while read -r n f; do
    [ "$f" = total ] && continue
    if [ "$n" -gt "$MAX_FILE_LINES" ]; then
        echo "file over $MAX_FILE_LINES lines: $f ($n lines)"
        bad=1
    fi
done < <(wc -l "${files[@]}")
# lizard warns when any threshold is passed; all but the length are set out of reach.
long=$(python3 -m lizard -w -L "$MAX_FUNCTION_LINES" -C 1000000 -a 1000000 -T nloc=1000000 \
    -T token_count=100000000 "${files[@]}" 2>/dev/null || true)
if [ -n "$long" ]; then
    echo "$long" | sed -E 's/^([^:]+:[0-9]+): warning: ([^ ]+) has .* ([0-9]+) length.*/function over '"$MAX_FUNCTION_LINES"' lines: \1 \2 (\3 lines)/'
    bad=1
fi
[ "$bad" = 0 ] && echo "sizes: every file <= $MAX_FILE_LINES lines, every function <= $MAX_FUNCTION_LINES lines"
exit "$bad"
