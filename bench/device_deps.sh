#!/usr/bin/env bash
# Assembles .deps/usr: the Debian packages' headers, static libraries and CMake configs that the GPU
# machine lacks (Eigen, nlohmann-json, GoogleTest/GMock, stb), copied from this machine after
# `bash tools/setup.sh` installed them. The device labs pass -DCMAKE_PREFIX_PATH=$PWD/.deps/usr; carry
# the folder with each device call (carry: [".deps"]; it is git-ignored).
# Usage (repo root): bash bench/device_deps.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps
for pkg in libeigen3-dev nlohmann-json3-dev libgtest-dev libgmock-dev libstb-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || { echo "device_deps.sh: $pkg is not installed (run bash tools/setup.sh first)" >&2; exit 1; }
    dpkg -L "$pkg" | while read -r f; do
        [ -f "$f" ] || continue
        case "$f" in
        /usr/include/* | /usr/share/eigen3/* | /usr/share/cmake/* | /usr/lib/cmake/* | /usr/lib/*/cmake/* | /usr/lib/*/*.a | /usr/share/pkgconfig/*)
            mkdir -p ".deps$(dirname "$f")" && cp -a "$f" ".deps$f" ;;
        esac
    done
done
echo "device_deps.sh: .deps/usr $(du -sh .deps | cut -f1)"
