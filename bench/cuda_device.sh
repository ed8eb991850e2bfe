#!/usr/bin/env bash
# Builds g4 on a GPU machine (header-only deps carried in .deps/usr, see bench/README.md) and runs
# the CUDA parity checks. Usage (from the repo root): bash bench/cuda_device.sh [OUTDIR]
set -euo pipefail
OUT=${1:-${OUT:-/tmp}}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps/usr" -DG4_BUILD_TESTS=OFF > "$OUT/cmake.log" 2>&1
cmake --build build-dev -j"$(nproc)" --target g4 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
python3 bench/cuda_parity.py build-dev/tools/g4 --out "$OUT"
