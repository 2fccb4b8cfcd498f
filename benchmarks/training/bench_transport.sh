#!/usr/bin/env bash
# 2-worker runs of `python -m tf_fusedrec.bench` (the same modes each time) over Horovod's two transports,
# alternating, so both see the same machine: Gloo (horovodrun --gloo: TCP over loopback) and Open MPI (horovodrun
# --mpi: shared memory between local ranks). Both from the one Horovod build scripts/install.sh makes.
#   MODES=fused,tfra_hand_fused,per_feature RUNS=3 OUT=benchmarks/results/bench/transport benchmarks/training/bench_transport.sh
# writes OUT/{gloo,mpi}-N/bench.json (N = 1..RUNS, gloo first); a run whose bench.json exists is kept. PIN=1 (default)
# runs each worker on a core (scripts/pin_worker.sh); STEPS, REPEATS and WARMUP pass through (defaults 15, 3, 10).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${MODES:?MODES=mode,mode,... is required}" "${OUT:?OUT=directory is required}"
RUNS=${RUNS:-3} STEPS=${STEPS:-15} REPEATS=${REPEATS:-3} WARMUP=${WARMUP:-10}
# mpirun refuses to start as root unless told that it is meant (the project's machines run as root).
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
pin=()
if [ "${PIN:-1}" = 1 ]; then pin=(scripts/pin_worker.sh); fi
for n in $(seq 1 "$RUNS"); do
  for transport in gloo mpi; do
    dir=$OUT/$transport-$n
    if [ -f "$dir/bench.json" ]; then
      echo "[bench_transport] $dir: done earlier, kept"
      continue
    fi
    echo "[bench_transport] $dir"
    .venv/bin/horovodrun -np 2 -H localhost:2 "--$transport" "${pin[@]}" .venv/bin/python -m tf_fusedrec.bench \
      --modes "$MODES" --sweep '' --steps "$STEPS" --repeats "$REPEATS" --warmup "$WARMUP" --out "$dir"
  done
done
