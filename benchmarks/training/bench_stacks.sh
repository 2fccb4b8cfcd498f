#!/usr/bin/env bash
# 2-worker runs of `python -m tf_fusedrec.bench` (the same modes each time) on the two tested stacks, alternating, so
# both see the same machine: the baseline stack (TensorFlow 2.16.2, Keras 2: this tree's .venv) against the current
# one (TensorFlow 2.21, Keras 3, NumPy 2: CURRENT's .venv-current).
#   CURRENT=/tmp/cur MODES=fused RUNS=3 OUT=benchmarks/results/bench/stacks benchmarks/training/bench_stacks.sh
# CURRENT: a copy of this tree where `FUSEDREC_STACK=current scripts/install.sh` ran (its op library is built in place
# against TensorFlow 2.21, which the baseline's would refuse, so the two stacks need two trees). Each stack runs with
# its own Horovod and the Makefile's launch (`make bench`: Open MPI, a core per worker). Writes
# OUT/{baseline,current}-N/bench.json, N = 1..RUNS, baseline first; a run whose bench.json exists is kept, so an
# interrupted series resumes. STEPS, REPEATS, WARMUP pass through (15, 3, 10). Then prints each mode's median over the
# runs per stack, and current / baseline.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${CURRENT:?CURRENT=a tree with .venv-current is required}" "${MODES:?MODES=mode,... is required}"
: "${OUT:?OUT=directory is required}"
RUNS=${RUNS:-3} STEPS=${STEPS:-15} REPEATS=${REPEATS:-3} WARMUP=${WARMUP:-10}
head=$(pwd)
out=$(realpath -m "$OUT")
current=$(realpath "$CURRENT")
root_env=()
if [ "$(id -u)" = 0 ]; then root_env=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1); fi
for n in $(seq 1 "$RUNS"); do
  for stack in baseline current; do
    dir=$out/$stack-$n
    if [ -f "$dir/bench.json" ]; then
      echo "[bench_stacks] $dir: done earlier, kept"
      continue
    fi
    if [ "$stack" = baseline ]; then
      src=$head venv=$head/.venv legacy=(env TF_USE_LEGACY_KERAS=1)
    else
      src=$current venv=$current/.venv-current legacy=(env -u TF_USE_LEGACY_KERAS)
    fi
    echo "[bench_stacks] $dir ($venv)"
    (cd "$src" && "${legacy[@]}" "${root_env[@]}" "$venv/bin/horovodrun" -np 2 -H localhost:2 --mpi \
      "$head/scripts/pin_worker.sh" "$venv/bin/python" -m tf_fusedrec.bench --modes "$MODES" --sweep '' \
      --steps "$STEPS" --repeats "$REPEATS" --warmup "$WARMUP" --out "$dir")
  done
done
python3 - "$out" "$RUNS" <<'EOF'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
per = {}
for stack in ("baseline", "current"):
    for n in range(1, runs + 1):
        with open(f"{out}/{stack}-{n}/bench.json") as f:
            for mode, r in json.load(f)["modes"].items():
                per.setdefault(mode, {}).setdefault(stack, []).append(r["samples_per_s"])
print("| mode | baseline samples/s (median) | current samples/s (median) | current / baseline |")
print("|---|---:|---:|---:|")
for mode, s in per.items():
    b, c = statistics.median(s["baseline"]), statistics.median(s["current"])
    print(f"| {mode} | {b:,.0f} | {c:,.0f} | {c / b:.2f}x |")
EOF
