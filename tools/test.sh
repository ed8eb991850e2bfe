#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing, builds, and runs every test through ctest.
# Usage: bash tools/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
G4_SETUP_SKIP_DEMO=1 BUILD_DIR="$BUILD_DIR" bash tools/setup.sh
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)"
