#!/usr/bin/env bash
# The ranker's asyncio HTTP server (86c20c8) against the thread-per-connection one before it (2bfc12f), alternated
# on the same machine: the hostile-client bench with the fuzzer back to back, then the open-loop saturation runs.
#
#   git worktree add /tmp/old_srv 2bfc12f && cp tf_fusedrec/ops/_fusedrec_ops.so /tmp/old_srv/tf_fusedrec/ops/
#   OLD=/tmp/old_srv EXPORT=/tmp/sv/export ROUNDS=3 benchmarks/results/serve/async_server/run.sh
#
# EXPORT: an export of configs/criteo_serve.yaml (benchmarks/serving/bench_serve_ab.py's docstring says how to make one).
# Each tree runs its own scripts and ranker (python from this tree's .venv, cwd the tree).
set -eu
here=$(cd "$(dirname "$0")/../../../.." && pwd)
out=$here/benchmarks/results/serve/async_server
old=${OLD:?the tree of the thread-per-connection ranker}
export_dir=${EXPORT:?an export of configs/criteo_serve.yaml}
rounds=${ROUNDS:-3}
py=$here/.venv/bin/python
for round in $(seq 1 "$rounds"); do
  for variant in threaded async; do
    tree=$here
    [ "$variant" = threaded ] && tree=$old
    (cd "$tree" && "$py" benchmarks/serving/bench_serve_hostile.py --export "$export_dir" --fuzz-qps 0 \
      --work-dir "/tmp/bench_serve_hostile_$variant" --out "$out/hostile-$variant-$round.json") \
      >"/tmp/hostile-$variant-$round.log" 2>&1
    echo "round $round $variant hostile: $(tail -1 "/tmp/hostile-$variant-$round.log")"
  done
done
for round in $(seq 1 "$rounds"); do
  for variant in threaded async; do
    tree=$here
    [ "$variant" = threaded ] && tree=$old
    (cd "$tree" && "$py" benchmarks/serving/bench_serve_ab.py --export "$export_dir" --setups plain --qps 5,160,320 \
      --prebuild auto --repeats 1 --duration 8 --work-dir "/tmp/bench_serve_ab_$variant" \
      --out "$out/saturation-$variant-$round.json") >"/tmp/saturation-$variant-$round.log" 2>&1
    echo "round $round $variant saturation: $(tail -1 "/tmp/saturation-$variant-$round.log")"
  done
done
