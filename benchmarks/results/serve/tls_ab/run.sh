#!/usr/bin/env bash
# Issue 58's target: the ranker's saturation and its p99 at half saturation with TLS on every hop (load generator to
# ranker HTTPS, ranker to embedding servers gRPC TLS, a throwaway CA) against plain text, the two stacks alternated run
# by run (benchmarks/serving/bench_serve_ab.py --transports plain,tls; the ranker without pooling or cache, the setup of
# the serve bench's latest saturation curves, which moves the most bytes over the servers' links; 64-instance requests,
# open loop, at most 64 in flight).
#   1. saturation.json: offered 480 q/s (past the plateau, about 300 req/s on 2 cores): achieved req/s is what the
#      ranker serves at most.
#   2. half.json: offered half of plain's median saturation from step 1: p50/p99 there.
# uptime.txt: the machine's load before, between and after.
#
#   EXPORT=/tmp/sv/export REPEATS=5 benchmarks/results/serve/tls_ab/run.sh
set -eu
here=$(cd "$(dirname "$0")/../../../.." && pwd)
out=$here/benchmarks/results/serve/tls_ab
export_dir=${EXPORT:?an export of configs/criteo_serve.yaml}
repeats=${REPEATS:-5}
cd "$here"
ab() {
  .venv/bin/python benchmarks/serving/bench_serve_ab.py --export "$export_dir" --setups plain \
    --transports plain,tls --prebuild auto --repeats "$repeats" --duration 10 --work-dir /tmp/bench_serve_tls_ab "$@"
}
echo "before: $(uptime)" >"$out/uptime.txt"
ab --qps 480 --out "$out/saturation.json"
half=$(.venv/bin/python -c "import json, statistics; runs = json.load(open('$out/saturation.json'))['runs']; \
print(round(statistics.median(r['requests_per_s'] for r in runs if r['transport'] == 'plain') / 2))")
echo "between (half saturation: $half q/s): $(uptime)" >>"$out/uptime.txt"
ab --qps "$half" --out "$out/half.json"
echo "after: $(uptime)" >>"$out/uptime.txt"
