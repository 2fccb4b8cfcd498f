#!/usr/bin/env bash
# The CUDA harness on a GPU machine that has nvcc but no TensorFlow (so no write_cases.py there): write the cases
# where TensorFlow is, carry them and the built harness, run this there.
#
#   here:  make cuda-harness && PYTHONPATH=. .venv/bin/python tests/cuda/write_cases.py build/cuda/bench_cases --bench
#   there: tests/cuda/device_check.sh build/cuda/bench_cases OUT_DIR
#
# Writes OUT_DIR/device.txt (GPU, driver, nvcc), check.log (every case through every op, REPEAT runs, default 20,
# exact against the oracle), bench.log (the timings of `make cuda-bench`, outputs checked first), and
# memcheck/racecheck/synccheck/initcheck.log (compute-sanitizer over one run of the correctness cases and of a
# generated 2.1M-key group). Rebuilds the harness there if the carried one does not start. Each log ends with its
# exit status; this script exits with the first that is not 0 (0: every kernel equals the oracle, sanitizers clean).
set -u
export PATH="$PATH:/usr/local/cuda/bin:/usr/local/nvidia/bin"
cases=${1:?usage: device_check.sh CASES_DIR OUT_DIR}
out=${2:?usage: device_check.sh CASES_DIR OUT_DIR}
repeat=${REPEAT:-20}
synthetic=${CUDA_BENCH_SYNTHETIC:-4096,65536,393216}
cd "$(dirname "$0")/../.."
mkdir -p "$out"
harness=build/cuda/harness
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version | tail -2
  uname -r
} >"$out/device.txt" 2>&1
if ! "$harness" "$cases" --compile-only >/dev/null 2>&1; then
  echo "carried harness does not start here; rebuilding" | tee -a "$out/device.txt"
  rm -f "$harness"
  make --no-print-directory cuda-harness >>"$out/device.txt" 2>&1 || exit 2
fi
rc=0
record() {  # record LOG STATUS: appends the status to the log, keeps the first failure
  echo "exit $2" >>"$1"
  if [ "$rc" -eq 0 ] && [ "$2" -ne 0 ]; then rc=$2; fi
}
timeout 120 "$harness" "$cases" --repeat "$repeat" >"$out/check.log" 2>&1
record "$out/check.log" $?
timeout 240 "$harness" "$cases" --bench --bench-synthetic "$synthetic" --repeat 1 >"$out/bench.log" 2>&1
record "$out/bench.log" $?
# The sanitizers over the correctness cases (the file bench case left out) plus one generated group of 26 x 81920
# (2.1M keys: pass 1's four-positions-a-thread path and the first-flags path), each run once.
small=$(mktemp -d)
grep -v ' bench=1 ' "$cases/cases.txt" >"$small/cases.txt"
while read -r name _; do ln -s "$(realpath "$cases/$name")" "$small/$name"; done <"$small/cases.txt"
for tool in memcheck racecheck synccheck initcheck; do
  timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 9 "$harness" "$small" --repeat 1 \
    --bench-synthetic 81920 --bench-repeats 1 >"$out/$tool.log" 2>&1
  record "$out/$tool.log" $?
done
exit $rc
