#!/usr/bin/env bash
# Issue 20's first target: `fused` on 2 workers, the tree the issue measured (396d1ef) against this one, alternating,
# under the issue's launch (Gloo, unpinned) and under today's `make bench` launch (Open MPI, a core per worker).
# Run from the repository root, with 396d1ef checked out at $BASE and its own op library built there
# (git worktree add $BASE 396d1ef; (cd $BASE && $PWD/.venv/bin/python setup.py -q build_ext --inplace)).
set -euo pipefail
BASE=${BASE:-/tmp/base_396}
OUT=benchmarks/results/bench/vs_396d1ef
head=$PWD
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
for n in ${RUNS:-1 2 3}; do
  for launch in gloo mpi_pinned; do
    for tree in base head; do
      dir=$head/$OUT/$launch-$tree-$n
      [ -f "$dir/bench.json" ] && continue
      src=$head; [ $tree = base ] && src=$BASE
      if [ $launch = gloo ]; then run=("$head/.venv/bin/horovodrun" -np 2 -H localhost:2 --gloo)
      else run=("$head/.venv/bin/horovodrun" -np 2 -H localhost:2 --mpi "$head/scripts/pin_worker.sh"); fi
      echo "[vs_396d1ef] $dir"
      (cd "$src" && PYTHONPATH="$src" "${run[@]}" "$head/.venv/bin/python" -m tf_fusedrec.bench --modes fused \
        --sweep '' --steps 15 --repeats 3 --warmup 10 --out "$dir" 2>&1 \
        | grep -E "^\[1,0\]<stdout>:\| fused|\| fused \|" || true)
    done
  done
done
