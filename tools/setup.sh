#!/usr/bin/env bash
# Installs what is missing (Debian packages), builds g4, then runs the main job: compile the embedded
# tiny Gemma 4 checkpoint (tests/fixtures/e2b_tiny) into a plan and generate from it on the CPU.
# Usage: bash tools/setup.sh            (BUILD_DIR defaults to ./build; G4_CMAKE_ARGS: extra configure options)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}

need=()
for pkg in cmake ninja-build g++ libeigen3-dev nlohmann-json3-dev libgtest-dev libgmock-dev libstb-dev libre2-dev \
    libjpeg62-turbo-dev libavformat-dev libavcodec-dev libswresample-dev libswscale-dev libavutil-dev pkgconf \
    libreadline-dev tmux libcpp-httplib-dev curl; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "== installing: ${need[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# G4_SETUP_SKIP_BUILD=1: install the packages only (tools/sanitize.sh makes its own build folders).
[ "${G4_SETUP_SKIP_BUILD:-0}" = 1 ] && exit 0

echo "== building ($BUILD_DIR)"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${G4_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"

if [ "${G4_SETUP_SKIP_DEMO:-0}" != 1 ]; then
    echo "== g4 compile (embedded tiny model: tests/fixtures/e2b_tiny)"
    mkdir -p out
    "$BUILD_DIR/tools/g4" compile --model tests/fixtures/e2b_tiny -o out/tiny.g4plan
    echo "== g4 run out/tiny.g4plan -p \"The capital of France is\" -n 24 --temp 0"
    "$BUILD_DIR/tools/g4" run out/tiny.g4plan -p "The capital of France is" -n 24 --temp 0 --stats
fi
