#!/usr/bin/env bash
# One-worker fused vs dense_only before (base, 4afc467) and after ops.valid_ids / ops.id_extremes (head), the trees
# alternating within each round, the first of a round alternating too (base first in odd rounds). Run from the
# repository root with the base tree checked out at $BASE
# (git worktree add $BASE 4afc467; cp tf_fusedrec/ops/_fusedrec_ops.so $BASE/tf_fusedrec/ops/).
set -euo pipefail
BASE=${BASE:-/tmp/base_vi}
OUT=benchmarks/results/bench/valid_ids_1127
head=$PWD
for n in 1 2 3 4 5 6; do
  order="base head"; [ $((n % 2)) = 0 ] && order="head base"
  for tree in $order; do
    dir=$head/$OUT/$tree-$n
    if [ $tree = base ]; then cd "$BASE"; else cd "$head"; fi
    PYTHONPATH=$PWD "$head/.venv/bin/python" -m tf_fusedrec.bench --modes fused,dense_only --sweep '' --steps 15 \
      --repeats 5 --warmup 10 --out "$dir" 2>&1 | grep -v "E external" | tail -4
    cd "$head"
  done
done
