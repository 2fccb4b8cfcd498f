#!/usr/bin/env bash
# The malformed-request gate (--malformed-qps, f11a61f) on and off, alternated on the same ranker tree: the hostile
# bench with the fuzzer back to back (a well-formed client's p99 beside it against its quiet p99).
#
#   EXPORT=/tmp/sv/export ROUNDS=3 benchmarks/results/serve/malformed_gate/run.sh
set -eu
here=$(cd "$(dirname "$0")/../../../.." && pwd)
out=$here/benchmarks/results/serve/malformed_gate
export_dir=${EXPORT:?an export of configs/criteo_serve.yaml}
rounds=${ROUNDS:-3}
cd "$here"
for round in $(seq 1 "$rounds"); do
  for variant in off on; do
    flags="--no-pooling --cache-mb 0"
    [ "$variant" = off ] && flags="$flags --malformed-qps 0"
    .venv/bin/python benchmarks/serving/bench_serve_hostile.py --export "$export_dir" --fuzz-qps 0 --ranker-flags "$flags" \
      --work-dir /tmp/bench_serve_hostile_gate --out "$out/$variant-$round.json" >"/tmp/gate-$variant-$round.log" 2>&1
    echo "round $round $variant: $(tail -1 "/tmp/gate-$variant-$round.log")"
  done
done
