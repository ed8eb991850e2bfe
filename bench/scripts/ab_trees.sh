#!/usr/bin/env bash
# A/B of two source trees on a CUDA GPU, side by side in one run: both trees built at once, a real-shape E2B
# checkpoint made once; `g4 bench -p 512 -n 128 -d $DEPTHS` alternated between the builds (each compiling its
# own NF4 plan), then the towers (bench/e2e/tower_ab.py: an image and a 30 s clip on the CPU with every core and
# on the GPU). Medians per side.
# Usage (repo root): [MODEL=e2b] [ROUNDS=3] [DEPTHS=0,4096] bash bench/scripts/ab_trees.sh OTHER_TREE
#   OTHER_TREE (side A) is a source folder of another g4 version (e.g. `git archive REV | tar -x -C DIR`); side B
#   is this tree. BUILD, CMAKE_ARGS, WORK, OUT: see lab_common.sh.
# Writes $OUT/ab_trees_<model>.txt (every bench JSON, the sides interleaved) and $OUT/ab_trees_towers.json.
set -u
MODEL=${MODEL:-e2b}
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-0,4096}
KV=bf16
source bench/scripts/lab_common.sh
OTHER=$(realpath "$1")
lab_checkpoint_start $MODEL $OUT/ab_ckpt.txt
LAB_ROOT=$PWD SIDES="A B"
lab_dir() { if [ $1 = A ]; then echo $OTHER; else echo $LAB_ROOT; fi; }
lab_build_sides OFF g4
echo "built: ${SECONDS}s"
lab_checkpoint_wait $OUT/ab_ckpt.txt
for s in A B; do
    lab_plan $(lab_dir $s)/$BUILD/tools/g4 $MODEL $KV $WORK/ab_trees_${MODEL}_$s.g4plan
done
echo "checkpoint and plans: ${SECONDS}s"
tree_side() { local s=$([ $1 = 0 ] && echo A || echo B); echo "$(lab_dir $s)/$BUILD/tools/g4 bench $WORK/ab_trees_${MODEL}_$s.g4plan"; }
lab_rounds $OUT/ab_trees_$MODEL.txt tree_side "$OTHER" "$LAB_ROOT"
python3 bench/e2e/tower_ab.py $(lab_dir A)/$BUILD/tools/g4 $(lab_dir B)/$BUILD/tools/g4 --out $OUT/ab_trees_towers.json \
    --dir $WORK/towers
