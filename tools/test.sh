#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing, builds, and runs every test through ctest.
# Usage: bash tools/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
# The Python package's tests (tests/python, ctest's python_tests) need nanobind, pytest, numpy and pillow from
# PyPI, and the extension built in the same folder (G4_PYTHON); the g4 serve tests (tests/serve) need pytest and
# openai. G4_PYTHON_TESTS=0 leaves them out.
G4_CMAKE_ARGS="-DG4_PYTHON=OFF"
if [ "${G4_PYTHON_TESTS:-1}" != 0 ]; then
    echo "== installing the Python test tools (nanobind, scikit-build-core, pytest, numpy, pillow, openai)"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check \
        nanobind scikit-build-core pytest numpy pillow openai
    G4_CMAKE_ARGS="-DG4_PYTHON=ON -DPython_EXECUTABLE=$(python3 -c 'import sys; print(sys.executable)')"
fi
G4_SETUP_SKIP_DEMO=1 BUILD_DIR="$BUILD_DIR" G4_CMAKE_ARGS="$G4_CMAKE_ARGS" bash tools/setup.sh
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)"
