#!/usr/bin/env bash
# A/B of compile options on a CUDA GPU, side by side in one run: one build, one real-shape NF4 plan per
# side (`g4 compile` with that side's extra flags), `g4 bench -p 512 -n 128 -d $DEPTHS` alternated between
# the plans, so the sides differ only in what the flags change. Medians per side.
# Usage (repo root): [MODEL=e2b] [ROUNDS=3] [DEPTHS=16,4096] [KV=bf16] bash bench/scripts/ab_plans.sh 'A_FLAGS' 'B_FLAGS' ...
#   e.g. bash bench/scripts/ab_plans.sh '--mlp-precision f32' '--mlp-precision f16'
# A side's leading NAME=VALUE words are set in the environment of its `g4 compile` only; the schedule's
# options are plain flags ('--mlp-fold off', '--ple-fold off', '--mlp-replicas 1').
# BUILD, CMAKE_ARGS, WORK, OUT: see lab_common.sh.
# Writes $OUT/ab_plans_<model>.txt (every bench JSON, the sides interleaved) and prints the medians.
set -u
MODEL=${MODEL:-e2b}
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-16,4096}
KV=${KV:-bf16}
source bench/scripts/lab_common.sh
lab_checkpoint_start $MODEL $OUT/ab_ckpt.txt
lab_build ab_plans
echo "built: ${SECONDS}s"
lab_checkpoint_wait $OUT/ab_ckpt.txt
s=0
for f in "$@"; do
    PLAN=$WORK/ab_plans_${MODEL}_$s.g4plan
    envs=() flags=()
    for w in $f; do
        if [ ${#flags[@]} = 0 ] && [[ $w =~ ^[A-Z_][A-Z0-9_]*= ]]; then envs+=("$w"); else flags+=("$w"); fi
    done
    (for e in "${envs[@]}"; do export "$e"; done; lab_plan $BUILD/tools/g4 $MODEL $KV $PLAN "${flags[*]}") || exit 1
    echo "side $s [$f]: $($BUILD/tools/g4 inspect $PLAN | grep 'CUDA decode schedule')"
    s=$((s + 1))
done
echo "checkpoint and plans: ${SECONDS}s"
plan_side() { echo "$BUILD/tools/g4 bench $WORK/ab_plans_${MODEL}_$1.g4plan"; }
lab_rounds $OUT/ab_plans_$MODEL.txt plan_side "$@"
