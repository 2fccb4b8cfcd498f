#!/usr/bin/env bash
# Where a 2-worker step's CPU goes: prof_step.py (beside this script) trains MODE on criteo_synthetic, warms up, then
# perf samples the whole machine for 5 s of its steady steps.
#   benchmarks/profiling/perf_step.sh MODE OUT/NAME   -> OUT/NAME-step.txt (ms/step, CPU ms/step per rank),
#                                                        OUT/NAME-dso.txt (share of samples per shared object),
#                                                        OUT/NAME-sym.txt (the 60 largest symbols)
# SRC: the source tree to run (default this one; an earlier commit's checkout for a before/after pair, run with this
# tree's .venv and op library; SRC_LIB=own keeps SRC's own library, for a tree whose ops differ). STEPS (default
# 700) must outlast perf's 5 s (with 150 steps of 13 ms, perf sampled the workers' exit instead). PIN=1 runs each
# worker on a core.
# TRANSPORT=mpi launches with horovodrun --mpi (Open MPI) instead of --gloo. VENV: the environment to run with
# (default this tree's .venv; e.g. SRC=CURRENT_TREE SRC_LIB=own VENV=CURRENT_TREE/.venv-current for the current stack,
# whose op library is built against its own TensorFlow).
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:?MODE}
out=$(realpath -m "${2:?OUT/NAME}")
head=$(pwd)
src=$(realpath "${SRC:-$head}")
tool=$head/benchmarks/profiling/prof_step.py
flag=$(mktemp -u /tmp/perf_step.XXXXXX)
mkdir -p "$(dirname "$out")"
if [ "$src" != "$head" ] && [ "${SRC_LIB:-}" != own ]; then
  cp tf_fusedrec/ops/_fusedrec_ops.so "$src/tf_fusedrec/ops/_fusedrec_ops.so"
fi
pin=()
if [ "${PIN:-0}" = 1 ]; then pin=("$head/scripts/pin_worker.sh"); fi
transport=${TRANSPORT:-gloo}
case "$transport" in gloo | mpi) ;; *) echo "perf_step: TRANSPORT must be gloo or mpi, got $transport" >&2; exit 2 ;; esac
# mpirun refuses to start as root unless told that it is meant.
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
venv=$(realpath "${VENV:-$head/.venv}")
(cd "$src" && PYTHONPATH="$src" "$venv/bin/horovodrun" -np 2 -H localhost:2 "--$transport" "${pin[@]}" \
  "$venv/bin/python" "$tool" "$mode" "${STEPS:-700}" "$flag" >"$out.log" 2>&1) &
runner=$!
while [ ! -f "$flag" ]; do
  if ! kill -0 "$runner" 2>/dev/null; then echo "perf_step: the run ended before its steady steps: $out.log"; exit 1; fi
  sleep 0.5
done
sleep 2
perf record -F 299 -a -g -o "$out.perf.data" -- sleep 5 >/dev/null 2>&1
wait "$runner"
grep -o "rank [0-9]* .*ms/step.*" "$out.log" | sort >"$out-step.txt"
perf report -i "$out.perf.data" --no-children --sort dso --stdio -g none 2>/dev/null | grep -v '^#' | grep . \
  >"$out-dso.txt"
perf report -i "$out.perf.data" --no-children --sort dso,sym --stdio -g none 2>/dev/null >"$out.sym.all"
grep -v '^#' "$out.sym.all" | grep . | cut -c1-160 | sed -n 1,60p >"$out-sym.txt"
rm -f "$out.sym.all"
rm -f "$out.perf.data" "$out.log" "$flag" "$flag.done"
cat "$out-step.txt"
