#!/usr/bin/env bash
# A/B of runtime switches on the GPU machine, side by side in one run: one build, one plan, `g4 bench`
# alternated between environment settings (e.g. G4_PLE_BLOCK=0 against the default), so the sides
# differ only in what the switch changes.
# Usage (repo root, $OUT set): [MODEL=e2b] [ROUNDS=3] [DEPTHS=16,4096] [KV=bf16] bash bench/ab_env.sh 'A_ENV' 'B_ENV' ...
#   each argument: space-separated VAR=value settings for one side ('' = the defaults)
# Writes $OUT/ab_env_<model>.txt (every bench JSON, the sides interleaved) and prints the medians.
set -u
MODEL=${MODEL:-e2b}
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-16,4096}
KV=${KV:-bf16}
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps/usr" -DG4_BUILD_TESTS=OFF > /tmp/ab_env_cmake.log 2>&1 &&
    cmake --build build-dev -j16 --target g4 > /tmp/ab_env_build.log 2>&1 || { tail -30 /tmp/ab_env_build.log; exit 1; }
echo "built: ${SECONDS}s"
[ -f /tmp/g4bench/$MODEL/config.json ] || python3 bench/e2e_bench.py build-dev/tools/g4 --model $MODEL --checkpoint-only > $OUT/ab_ckpt.txt 2>&1 ||
    { tail $OUT/ab_ckpt.txt; exit 1; }
PLAN=/tmp/ab_env_$MODEL.g4plan
build-dev/tools/g4 compile --model /tmp/g4bench/$MODEL --device cuda --weights nf4 --kv-dtype $KV --chunk 1024 --max-context 32768 \
    --no-fidelity -o $PLAN 2> /tmp/ab_env_compile.txt || { tail /tmp/ab_env_compile.txt; exit 1; }
build-dev/tools/g4 inspect $PLAN | grep "CUDA decode schedule"
echo "checkpoint and plan: ${SECONDS}s"
R=$OUT/ab_env_$MODEL.txt
: > $R
for r in $(seq $ROUNDS); do
    s=0
    for e in "$@"; do
        side=$(printf "\\x$(printf %x $((65 + s)))")
        echo "## round $r $side [$e]" >> $R
        env $e build-dev/tools/g4 bench $PLAN -p 512 -n 128 -d $DEPTHS -r 3 --json >> $R 2>&1
        s=$((s + 1))
    done
done
python3 bench/ab_summary.py "$R"
