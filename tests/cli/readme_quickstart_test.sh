#!/usr/bin/env bash
# Runs README.md's quick start (the sh block between <!-- quickstart:begin --> and <!-- quickstart:end -->)
# exactly as written, except that its variable lines (NAME=value before the first command) are replaced by the
# tiny fixtures' paths; stdin is empty, so `g4 chat` ends at once. Fails if any command fails.
# Usage: readme_quickstart_test.sh G4 SOURCE_DIR
set -euo pipefail
g4=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fx=$src/tests/fixtures
block=$(sed -n '/<!-- quickstart:begin -->/,/<!-- quickstart:end -->/p' "$src/README.md" | sed '/^<!--/d; /^```/d')
[ -n "$block" ] || { echo "README.md has no quickstart block"; exit 1; }
for v in G4 MODEL ADAPTER IMAGE AUDIO COMPILE_FLAGS; do
    grep -q "^$v=" <<<"$block" || { echo "the quickstart block no longer sets $v (update this test)"; exit 1; }
done
body=$(grep -v '^[A-Z_0-9]*=' <<<"$block")
cat > "$work/quickstart.sh" <<VARS
set -e
G4='$g4'
MODEL='$fx/e2b_tiny_mm'
ADAPTER='$fx/adapters/e2b_lora'
IMAGE='$fx/towers/image/grey_50x90.png'
AUDIO='$fx/towers/audio/clip0.wav'
COMPILE_FLAGS="--image-tokens 70"
VARS
printf '%s\n' "$body" >> "$work/quickstart.sh"
cd "$work"
bash -x ./quickstart.sh </dev/null
for f in model.g4plan tuned.g4plan; do [ -s "$f" ] || { echo "$f was not written"; exit 1; }; done
echo "quickstart ok"
