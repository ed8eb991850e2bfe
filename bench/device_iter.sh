#!/usr/bin/env bash
# One kernel-iteration round on the GPU machine: build, CUDA kernel tests, fixture parity, quick E2B
# decode bench, per-kernel Nsight Compute table; NCU_DETAIL=REGEX adds a full ncu report of one kernel.
# Usage (repo root, $OUT set): [DEPTHS=0,4096] [NCU_DETAIL=g4_gemv_nf4_l16_m2] bash bench/device_iter.sh
set -u
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps/usr" -DG4_BUILD_TESTS=ON > $OUT/cmake.log 2>&1
cmake --build build-dev -j16 --target cuda_kernels_test g4 > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
build-dev/tests/cuda_kernels_test > $OUT/kt.txt 2>&1; grep -E "FAILED|PASSED" $OUT/kt.txt | head -20
python3 bench/cuda_parity.py build-dev/tools/g4 --out $OUT > $OUT/parity.txt 2>&1; tail -1 $OUT/parity.txt
PYTHONPATH=$PWD/.bnb timeout 300 python3 bench/e2e_bench.py build-dev/tools/g4 --model e2b --out $OUT --g4-only --quick --depths ${DEPTHS:-0} > $OUT/bench.txt 2>&1; grep -E "ttft|programmatic|decode vs" $OUT/bench.txt
PYTHONPATH=$PWD/.bnb timeout 200 python3 bench/e2e_bench.py build-dev/tools/g4 --model e2b --out $OUT --profile > $OUT/prof.txt 2>&1
python3 bench/ncu_summary.py $OUT/ncu_e2b.csv | head -${NCU_LINES:-24}
if [ -n "${NCU_DETAIL:-}" ]; then
  ncu -k regex:$NCU_DETAIL -c 1 --set full /work/main/build-dev/tools/g4 run /tmp/g4bench/e2b.g4plan --tokens 2,5,6,7 -n 2 --temp 0 --ignore-eos > $OUT/ncu_detail.txt 2>&1
  grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Executed Ipc A|Theoretical Occupancy|Block Limit" $OUT/ncu_detail.txt | head -20
fi
