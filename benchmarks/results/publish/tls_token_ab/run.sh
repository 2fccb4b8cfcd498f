#!/usr/bin/env bash
# Issue 58's target: freshness p99 with authenticated publishing <= 10 s. benchmarks/publishing/bench_publish.py with
# --transports plain,tls-token: two stacks (2 embedding servers + a ranker each) on the same export, one in plain text
# (publishing unauthenticated on loopback, as the bench's default), one with TLS on every hop (servers' gRPC, the
# ranker's HTTPS on both ports, the trainer's publish with --tls-ca, the bench's polls over HTTPS; a throwaway CA) and
# the publish token on the servers, the ranker and the trainer. Each round trains once per stack, plain first, each
# run publishing every 50 of 200 steps (2 workers under horovodrun, criteo_synthetic) while the bench polls that
# stack's ranker 20 times a second; --modes publish leaves out the runs without publishing (freshness only).
# Freshness: from the start of a publish (the trainer's "published version" line less its seconds) to the first
# predict answer carrying the version. uptime.txt: the machine's load before and after.
#
#   REPEATS=4 benchmarks/results/publish/tls_token_ab/run.sh
set -eu
here=$(cd "$(dirname "$0")/../../../.." && pwd)
out=$here/benchmarks/results/publish/tls_token_ab
cd "$here"
export TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=2
echo "before: $(uptime)" >"$out/uptime.txt"
.venv/bin/python benchmarks/publishing/bench_publish.py --out "$out" --steps 200 --every 50 \
  --repeats "${REPEATS:-4}" --transports plain,tls-token --modes publish
echo "after: $(uptime)" >>"$out/uptime.txt"
