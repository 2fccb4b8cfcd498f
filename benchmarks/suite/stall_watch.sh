#!/usr/bin/env bash
# Native stacks of a test that stalls: run beside `TF_FUSEDREC_CPU_REPORT=DIR make test` (or .ci/run). When
# tests/conftest.py writes a "Timeout" (a test call still running after 20 s) to DIR/stacks-WORKER-PID.txt, this
# writes OUT/TIME-PID.txt with that process's state, py-spy's native stacks of its Python threads (py-spy, when on
# PATH or in PYSPY) and gdb's backtrace of every thread (TensorFlow's own threads included), so a test that waits far
# longer than its CPU shows what it waits on. Nothing here is installed by the project: install py-spy or gdb first.
#   usage: benchmarks/suite/stall_watch.sh DIR OUT [SECONDS (default 1800)]
set -uo pipefail
dir=${1:?usage: benchmarks/suite/stall_watch.sh DIR OUT [SECONDS]}
out=${2:?usage: benchmarks/suite/stall_watch.sh DIR OUT [SECONDS]}
end=$((SECONDS + ${3:-1800}))
pyspy=${PYSPY:-$(command -v py-spy || true)}
mkdir -p "$out"
declare -A seen
while [ $SECONDS -lt $end ]; do
  for f in "$dir"/stacks-*.txt; do
    [ -f "$f" ] || continue
    n=$(grep -c "^Timeout" "$f")
    if [ "${seen[$f]:-0}" != "$n" ]; then
      seen[$f]=$n
      pid=${f##*-}; pid=${pid%.txt}
      {
        grep "^== " "$f" | tail -1
        awk '{print "state", $3}' "/proc/$pid/stat" 2>/dev/null
        [ -n "$pyspy" ] && "$pyspy" dump --native -p "$pid"
        command -v gdb >/dev/null && gdb -p "$pid" -batch -ex "thread apply all bt 30" 2>/dev/null | grep -v "^\[New LWP"
      } > "$out/$(date +%s)-$pid.txt" 2>&1
    fi
  done
  sleep 1
done
