#!/usr/bin/env bash
# Formats every tracked C, C++ and CUDA file with the repository's .clang-format, or checks it.
# Usage: bash tools/format.sh            reformat in place
#        bash tools/format.sh --check    list the files that are not formatted and exit 1 if any
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang-format >/dev/null
fi
mapfile -t files < <(git ls-files -- '*.c' '*.cc' '*.cpp' '*.h' '*.hpp' '*.cu' '*.cuh' | grep -v '^tests/fixtures/')
if [ "${1:-}" = "--check" ]; then
    bad=()
    for f in "${files[@]}"; do
        clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
    done
    if [ ${#bad[@]} -gt 0 ]; then
        printf 'not formatted (run bash tools/format.sh): %s\n' "${bad[@]}"
        echo "format check: ${#bad[@]} of ${#files[@]} files need formatting"
        exit 1
    fi
    echo "format check: ${#files[@]} files formatted"
else
    clang-format -i "${files[@]}"
fi
