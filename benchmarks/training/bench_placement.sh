#!/usr/bin/env bash
# 2-worker runs of `python -m tf_fusedrec.bench` (the same modes each time), pinned (scripts/pin_worker.sh: a core per
# worker) and unpinned alternating, so both placements see the same machine:
#   MODES=fused,fused_dbp,fused_fwp RUNS=2 OUT=benchmarks/results/bench/pipelines_native benchmarks/training/bench_placement.sh
# writes OUT/{pinned,unpinned}-N/bench.json (N = 1..RUNS, pinned first); a run whose bench.json exists is kept, so an
# interrupted series resumes. STEPS, REPEATS and WARMUP pass through (defaults 15, 3, 10).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${MODES:?MODES=mode,mode,... is required}" "${OUT:?OUT=directory is required}"
RUNS=${RUNS:-2} STEPS=${STEPS:-15} REPEATS=${REPEATS:-3} WARMUP=${WARMUP:-10}
# HOROVODRUN from the environment, or the Makefile's HOROVODRUN line.
read -r -a horovodrun <<<"${HOROVODRUN:-.venv/bin/horovodrun -np 2 -H localhost:2 --gloo}"
for n in $(seq 1 "$RUNS"); do
  for placement in pinned unpinned; do
    dir=$OUT/$placement-$n
    if [ -f "$dir/bench.json" ]; then
      echo "[bench_placement] $dir: done earlier, kept"
      continue
    fi
    pin=()
    if [ "$placement" = pinned ]; then pin=(scripts/pin_worker.sh); fi
    echo "[bench_placement] $dir"
    "${horovodrun[@]}" "${pin[@]}" .venv/bin/python -m tf_fusedrec.bench \
      --modes "$MODES" --sweep '' --steps "$STEPS" --repeats "$REPEATS" --warmup "$WARMUP" --out "$dir"
  done
done
