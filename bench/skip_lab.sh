#!/usr/bin/env bash
# Decode time by launch class with programmatic launch on (a timing lab: skipped launches make the
# output wrong): g4 bench on one real-shape NF4 plan with G4_DECODE_SKIP set to each class in turn.
# Usage (repo root of a GPU machine): [MODEL=e2b] [ROUNDS=2] [DEPTHS=0] [SKIPS='none resnorm ...'] bash bench/skip_lab.sh
set -u
MODEL=${MODEL:-e2b}
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps/usr" -DG4_BUILD_TESTS=OFF > /tmp/cmake.log 2>&1
cmake --build build-dev -j16 --target g4 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
PYTHONPATH=$PWD/.bnb python3 bench/e2e_bench.py build-dev/tools/g4 --model $MODEL --checkpoint-only > /tmp/ckpt.txt 2>&1 || { tail /tmp/ckpt.txt; exit 1; }
build-dev/tools/g4 compile --model /tmp/g4bench/$MODEL --device cuda --weights nf4 --kv-dtype bf16 --chunk 1024 --max-context 32768 --no-fidelity -o /tmp/p.g4plan 2> /tmp/compile.txt || { tail /tmp/compile.txt; exit 1; }
for r in $(seq ${ROUNDS:-2}); do
for sk in ${SKIPS:-none resnorm qkv_post attention gemv_nf4 gemv_bf16 lm_head resnorm,qkv_post,attention,gemv_nf4,gemv_bf16,lm_head}; do
  v=$sk; [ $sk = none ] && v=
  echo "## $r skip=$sk"
  G4_DECODE_SKIP=$v build-dev/tools/g4 bench /tmp/p.g4plan -p 512 -n 128 -d ${DEPTHS:-0} -r 3 --json 2>&1 | grep -v "^\s*$" | tail -3
done
done
