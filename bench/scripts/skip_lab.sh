#!/usr/bin/env bash
# What each class of decode launches costs on the critical path with programmatic launch on (a timing lab:
# skipped launches make the output wrong): `g4 bench -p 512 -n 128` on one real-shape NF4 plan with
# G4_DECODE_SKIP set to each class in turn (classes: docs/runtime.md). Needs a CUDA GPU.
# Usage (repo root): [MODEL=e2b] [ROUNDS=2] [DEPTHS=0] [SKIPS='none resnorm ...'] bash bench/scripts/skip_lab.sh
# BUILD, CMAKE_ARGS, WORK: see lab_common.sh. Prints each side's JSON.
set -u
MODEL=${MODEL:-e2b}
source bench/scripts/lab_common.sh
lab_build skip_lab
lab_checkpoint $MODEL $WORK/skip_ckpt.txt
lab_plan $BUILD/tools/g4 $MODEL bf16 $WORK/skip_lab.g4plan
for r in $(seq ${ROUNDS:-2}); do
for sk in ${SKIPS:-none resnorm qkv_post attention gemv_nf4 gemv_bf16 lm_head resnorm,qkv_post,attention,gemv_nf4,gemv_bf16,lm_head}; do
  v=$sk; [ $sk = none ] && v=
  echo "## $r skip=$sk"
  G4_DECODE_SKIP=$v $BUILD/tools/g4 bench $WORK/skip_lab.g4plan -p 512 -n 128 -d ${DEPTHS:-0} -r 3 --json 2>&1 | grep -v "^\s*$" | tail -3
done
done
