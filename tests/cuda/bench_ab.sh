#!/usr/bin/env bash
# Alternates `harness --bench` between builds of the harness on one GPU (timings compare only within one run):
#
#   tests/cuda/bench_ab.sh CASES_DIR ROUNDS HARNESS...
#   e.g. tests/cuda/bench_ab.sh build/cuda/bench_cases 3 build/cuda/old build/cuda/harness
#
# Prints each build's bench lines per round; CUDA_BENCH_SYNTHETIC as in device_check.sh.
set -u
cases=${1:?usage: bench_ab.sh CASES_DIR ROUNDS HARNESS...}
rounds=${2:?usage: bench_ab.sh CASES_DIR ROUNDS HARNESS...}
shift 2
for round in $(seq "$rounds"); do
  for harness in "$@"; do
    echo "== $harness round $round"
    "$harness" "$cases" --repeat 0 --bench --bench-synthetic "${CUDA_BENCH_SYNTHETIC:-4096,65536,393216}" | grep "n="
  done
done
