#!/usr/bin/env bash
# Runs the g4 serve tests (pytest, tests/serve) against the g4 CLI given as $1. Exits 77 (ctest: skipped) with
# a line saying why when pytest, the openai package or curl is missing (bash tools/test.sh installs them).
set -euo pipefail
export G4_CLI=$1
if ! python3 -c 'import openai, pytest' 2>/dev/null; then
    echo "skipped: the g4 serve tests need the Python packages openai and pytest (pip install openai pytest)"
    exit 77
fi
if ! command -v curl >/dev/null; then
    echo "skipped: the g4 serve tests need curl (apt-get install curl)"
    exit 77
fi
cd "$(dirname "$0")"
exec env PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider .
