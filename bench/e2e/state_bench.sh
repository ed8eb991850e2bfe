#!/usr/bin/env bash
# Prompt caching: compiles MODEL into a plan holding the prompt and runs bench/micro/state_bench on it, which
# times the prompt's prefill against saving the session state to a file and loading it into a fresh session
# (and checks the next-token logits after the load are bit-identical).
# Usage: bash bench/e2e/state_bench.sh MODEL_DIR [TOKENS] [REPS]   (BUILD_DIR, default build; THREADS; extra
# g4 compile flags in COMPILE_FLAGS, e.g. "--device cuda --kv-dtype bf16")
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:?usage: state_bench.sh MODEL_DIR [TOKENS] [REPS]}
tokens=${2:-2000}
reps=${3:-5}
build=${BUILD_DIR:-build}
cmake --build "$build" --target g4 state_bench >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ctx=$(( (tokens + 1 + 255) / 256 * 256 ))
# shellcheck disable=SC2086
"$build/tools/g4" compile --model "$model" --max-context "$ctx" --no-fidelity ${COMPILE_FLAGS:-} \
    -o "$tmp/plan.g4plan" >"$tmp/compile.log" 2>&1 || { cat "$tmp/compile.log" >&2; exit 1; }
"$build/bench/micro/state_bench" "$tmp/plan.g4plan" --tokens "$tokens" --reps "$reps" \
    --threads "${THREADS:-0}" --dir "$tmp"
