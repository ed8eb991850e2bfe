#!/usr/bin/env bash
# Session 42, on the GPU machine after bench/ab_plans.sh '' 'G4_MLP_FOLD=0': the two real-shape plans' greedy
# decodes of one prompt (32 steps) and their decode logits compared, step by step.
G4=build-dev/tools/g4
M=${MODEL:-e2b}
for s in 0 1; do
    $G4 run /tmp/ab_plans_${M}_$s.g4plan --tokens 2,818,5279,529,7001,563,3107,236761,1018,4 -n 32 --temp 0 --ignore-eos --print-ids \
        --dump-decode-logits /tmp/fl_$s.bin > /tmp/fl_$s.txt 2> /tmp/fl_$s.err || tail -3 /tmp/fl_$s.err
done
python3 - << 'PY'
import numpy as np
a, b = np.fromfile('/tmp/fl_0.bin', np.float32), np.fromfile('/tmp/fl_1.bin', np.float32)
ta, tb = open('/tmp/fl_0.txt').read().split(), open('/tmp/fl_1.txt').read().split()
print('tokens folded  :', ta[-1][:200]); print('tokens unfolded:', tb[-1][:200]); print('tokens equal:', ta[-1] == tb[-1])
V = 262144
n = min(a.size, b.size) // V
a, b = a[:n * V].reshape(n, V), b[:n * V].reshape(n, V)
for i in range(n):
    d = np.abs(a[i] - b[i]).max() / np.abs(b[i]).max()
    s = np.sort(b[i])[-2:]
    print(f'step {i:2d}: max|diff|/max|logit| {d:.2e}, argmax {a[i].argmax()} vs {b[i].argmax()}, top-two gap {s[1] - s[0]:.3f}')
PY
