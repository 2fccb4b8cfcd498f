#!/usr/bin/env bash
# One-worker fused vs dense_only before (base: the commit before UniqueRows, 6c41d98) and after (head), at one and
# at four steps a call, the trees alternating within each round and the first of a round alternating too. Run from
# the repository root with the base checked out at $BASE
# (git worktree add $BASE 6c41d98; cp tf_fusedrec/ops/_fusedrec_ops.so $BASE/tf_fusedrec/ops/).
set -euo pipefail
BASE=${BASE:-/tmp/base_ur}
OUT=benchmarks/results/bench/unique_rows_1127
head=$PWD
for n in 1 2 3; do
  order="base head"; [ $((n % 2)) = 0 ] && order="head base"
  for k in 1 4; do
    for tree in $order; do
      dir=$head/$OUT/k$k/$tree-$n
      [ -f "$dir/bench.json" ] && continue
      src=$head; [ $tree = base ] && src=$BASE
      (cd "$src" && PYTHONPATH=$src "$head/.venv/bin/python" -m tf_fusedrec.bench --modes fused,dense_only --sweep '' \
        --steps 16 --repeats 5 --warmup 12 --steps-per-call $k --out "$dir" 2>&1 | grep -E "^\| (fused|dense_only) " \
        | cut -c1-40 | sed "s|^|k$k $tree-$n |")
    done
  done
done
