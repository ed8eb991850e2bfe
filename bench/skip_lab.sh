#!/usr/bin/env bash
# Decode time by launch class with programmatic launch on (a timing lab: skipped launches make the
# output wrong): g4 bench on one real-shape NF4 plan with G4_DECODE_SKIP set to each class in turn.
# Usage (repo root of a GPU machine): [MODEL=e2b] [ROUNDS=2] [DEPTHS=0] [SKIPS='none resnorm ...'] bash bench/skip_lab.sh
set -u
MODEL=${MODEL:-e2b}
source bench/lab_common.sh
lab_build skip_lab
lab_checkpoint $MODEL /tmp/ckpt.txt
lab_plan build-dev/tools/g4 $MODEL bf16 /tmp/p.g4plan
for r in $(seq ${ROUNDS:-2}); do
for sk in ${SKIPS:-none resnorm qkv_post attention gemv_nf4 gemv_bf16 lm_head resnorm,qkv_post,attention,gemv_nf4,gemv_bf16,lm_head}; do
  v=$sk; [ $sk = none ] && v=
  echo "## $r skip=$sk"
  G4_DECODE_SKIP=$v build-dev/tools/g4 bench /tmp/p.g4plan -p 512 -n 128 -d ${DEPTHS:-0} -r 3 --json 2>&1 | grep -v "^\s*$" | tail -3
done
done
