#!/usr/bin/env bash
# 2-worker runs of `python -m tf_fusedrec.bench` (the same modes each time) from two source trees, alternating, so
# both see the same machine: the tree of an earlier commit against this one.
#   BASE=/tmp/base MODES=fused RUNS=3 OUT=benchmarks/results/bench/step_cost benchmarks/training/bench_commits.sh
# BASE: a checkout of the earlier commit (git worktree add /tmp/base COMMIT), run with this tree's .venv and op
# library (copied into BASE: the library only ever gains ops). Writes OUT/{base,head}-{pinned,unpinned}-N/bench.json,
# N = 1..RUNS, base first; a run whose bench.json exists is kept, so an interrupted series resumes. PLACEMENTS
# (default "pinned unpinned": scripts/pin_worker.sh or not), STEPS, REPEATS, WARMUP pass through (15, 3, 10).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${BASE:?BASE=checkout of the earlier commit is required}" "${MODES:?MODES=mode,... is required}"
: "${OUT:?OUT=directory is required}"
RUNS=${RUNS:-3} STEPS=${STEPS:-15} REPEATS=${REPEATS:-3} WARMUP=${WARMUP:-10}
PLACEMENTS=${PLACEMENTS:-pinned unpinned}
head=$(pwd)
out=$(realpath -m "$OUT")
lib=tf_fusedrec/ops/_fusedrec_ops.so
cp "$lib" "$BASE/$lib"
read -r -a horovodrun <<<"${HOROVODRUN:-.venv/bin/horovodrun -np 2 -H localhost:2 --gloo}"
for n in $(seq 1 "$RUNS"); do
  for placement in $PLACEMENTS; do
    for tree in base head; do
      dir=$out/$tree-$placement-$n
      if [ -f "$dir/bench.json" ]; then
        echo "[bench_commits] $dir: done earlier, kept"
        continue
      fi
      pin=()
      if [ "$placement" = pinned ]; then pin=("$head/scripts/pin_worker.sh"); fi
      src=$head
      if [ "$tree" = base ]; then src=$(realpath "$BASE"); fi
      echo "[bench_commits] $dir ($src)"
      (cd "$src" && PYTHONPATH="$src" "${horovodrun[@]/#.venv/$head/.venv}" "${pin[@]}" "$head/.venv/bin/python" \
        -m tf_fusedrec.bench --modes "$MODES" --sweep '' --steps "$STEPS" --repeats "$REPEATS" --warmup "$WARMUP" \
        --out "$dir")
    done
  done
done
