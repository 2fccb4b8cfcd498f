#!/usr/bin/env bash
# 2-worker runs of `python -m tf_fusedrec.bench` (the same modes each time) under several values of one environment
# variable, alternating, so all values see the same machine (Horovod's knobs, thread counts):
#   VAR=HOROVOD_CYCLE_TIME VALUES="0.2 1 5" MODES=fused RUNS=3 OUT=benchmarks/results/bench/cycle_time benchmarks/training/bench_env.sh
# writes OUT/VALUE-N/bench.json (N = 1..RUNS); a value "default" leaves the variable unset; a run whose bench.json
# exists is kept. PIN=1 (default) runs each worker on a core (scripts/pin_worker.sh); STEPS, REPEATS and WARMUP pass
# through (defaults 15, 3, 10).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${VAR:?VAR=name is required}" "${VALUES:?VALUES=\"v1 v2 ...\" is required}" "${MODES:?MODES=mode,... is required}"
: "${OUT:?OUT=directory is required}"
RUNS=${RUNS:-3} STEPS=${STEPS:-15} REPEATS=${REPEATS:-3} WARMUP=${WARMUP:-10}
read -r -a horovodrun <<<"${HOROVODRUN:-.venv/bin/horovodrun -np 2 -H localhost:2 --gloo}"
pin=()
if [ "${PIN:-1}" = 1 ]; then pin=(scripts/pin_worker.sh); fi
for n in $(seq 1 "$RUNS"); do
  for value in $VALUES; do
    dir=$OUT/$value-$n
    if [ -f "$dir/bench.json" ]; then
      echo "[bench_env] $dir: done earlier, kept"
      continue
    fi
    echo "[bench_env] $dir: $VAR=$value"
    env_args=(-u "$VAR")
    if [ "$value" != default ]; then env_args=("$VAR=$value"); fi
    env "${env_args[@]}" "${horovodrun[@]}" "${pin[@]}" .venv/bin/python -m tf_fusedrec.bench \
      --modes "$MODES" --sweep '' --steps "$STEPS" --repeats "$REPEATS" --warmup "$WARMUP" --out "$dir"
  done
done
