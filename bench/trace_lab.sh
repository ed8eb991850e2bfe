#!/usr/bin/env bash
# The decode step's timeline on the GPU machine: one real-shape NF4 plan compiled twice, as is and with
# the kernel trace (G4_KERNEL_TRACE=1: the first and last block of every decode kernel record the global
# timer at entry, after the programmatic wait and at exit), `g4 bench` on both (the trace's cost), then
# bench/trace_summary.py: each launch's share of the critical path (release to release).
# Usage (repo root, $OUT set): [MODELS=e2b] [DEPTH=16] [KV=bf16] [TWICE=qkv_attn,gemv_nf4] bash bench/trace_lab.sh
# Writes $OUT/trace_<model>.bin, $OUT/trace_<model>.txt (the summary), $OUT/trace_<model>.csv. TWICE: one more
# traced run with G4_DECODE_TWICE=$TWICE (those launch classes made twice in a row, so the second runs
# with warm caches; the output is wrong), trace_<model>_twice.*.
set -u
MODELS=${MODELS:-e2b}
DEPTH=${DEPTH:-16}
KV=${KV:-bf16}
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps/usr" -DG4_BUILD_TESTS=OFF > /tmp/trace_cmake.log 2>&1 &&
    cmake --build build-dev -j16 --target g4 > /tmp/trace_build.log 2>&1 || { tail -30 /tmp/trace_build.log; exit 1; }
echo "built: ${SECONDS}s"
for MODEL in ${MODELS//,/ }; do
    [ -f /tmp/g4bench/$MODEL/config.json ] || python3 bench/e2e_bench.py build-dev/tools/g4 --model $MODEL --checkpoint-only > $OUT/trace_ckpt_$MODEL.txt 2>&1 ||
        { tail $OUT/trace_ckpt_$MODEL.txt; exit 1; }
    for t in 0 1; do
        [ -f /tmp/trace_${MODEL}_$t.g4plan ] && continue
        G4_KERNEL_TRACE=$t build-dev/tools/g4 compile --model /tmp/g4bench/$MODEL --device cuda --weights nf4 --kv-dtype $KV --chunk 1024 \
            --max-context 32768 --no-fidelity -o /tmp/trace_${MODEL}_$t.g4plan 2> /tmp/trace_compile.txt || { tail /tmp/trace_compile.txt; exit 1; }
    done
    echo "$MODEL checkpoint and plans: ${SECONDS}s"
    R=$OUT/trace_$MODEL.txt
    : > $R
    for t in 0 1; do
        echo "## plan traced=$t: g4 bench -p 512 -n 128 -d $DEPTH -r 2" >> $R
        G4_TRACE_OUT=$OUT/trace_$MODEL.bin build-dev/tools/g4 bench /tmp/trace_${MODEL}_$t.g4plan -p 512 -n 128 -d $DEPTH -r 2 >> $R 2>&1
    done
    python3 bench/trace_summary.py $OUT/trace_$MODEL.bin --csv $OUT/trace_$MODEL.csv >> $R 2>&1
    if [ -n "${TWICE:-}" ]; then
        R=$OUT/trace_${MODEL}_twice.txt
        echo "## plan traced=1, G4_DECODE_TWICE=$TWICE: g4 bench -p 512 -n 128 -d $DEPTH -r 2" > $R
        G4_DECODE_TWICE=$TWICE G4_TRACE_OUT=$OUT/trace_${MODEL}_twice.bin build-dev/tools/g4 bench /tmp/trace_${MODEL}_1.g4plan -p 512 -n 128 \
            -d $DEPTH -r 2 >> $R 2>&1
        python3 bench/trace_summary.py $OUT/trace_${MODEL}_twice.bin --csv $OUT/trace_${MODEL}_twice.csv >> $R 2>&1
    fi
    echo "$MODEL traced: ${SECONDS}s"
done
