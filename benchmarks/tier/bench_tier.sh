#!/usr/bin/env bash
# The tiered-table benchmark (issue 57): 2-worker training of criteo_synthetic's model with every row in DRAM against
# tiered tables (a DRAM cache per table and worker over RocksDB), alternating run by run, at each Zipf exponent.
#   benchmarks/tier/bench_tier.sh                       # ZIPFS="1.05 1.2 0.9" RUNS=2 VOCAB=1500000 DRAM=192MiB
#   OUT=benchmarks/results/tier ZIPFS=1.05 RUNS=3 benchmarks/tier/bench_tier.sh
# WARMUP (300) untimed steps first: the cache starts full of the fill's rows and takes ~200 steps to hold the rows
# training reads. Each run: a fresh 2-worker job (Open MPI, a core per worker, as `make bench`) of benchmarks/tier/bench_tier.py,
# which fills the tables with the whole vocabulary, warms up, then times STEPS steps; writes
# OUT/zipf<Z>/<mode>-<n>/result.json (a run whose result exists is kept, so an interrupted series resumes), then
# prints per Zipf exponent the median samples/s of each mode, tiered / dram, and the hit rate.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/results/tier} ZIPFS=${ZIPFS:-"1.05 1.2 0.9"} RUNS=${RUNS:-2}
VOCAB=${VOCAB:-1500000} DRAM=${DRAM:-192MiB} STEPS=${STEPS:-60} WARMUP=${WARMUP:-300}
TIER_PATH=${TIER_PATH:-/var/tmp/fusedrec_bench_tier}
root_env=()
if [ "$(id -u)" = 0 ]; then root_env=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1); fi
for zipf in $ZIPFS; do
  for n in $(seq 1 "$RUNS"); do
    for mode in dram tiered; do
      dir=$OUT/zipf$zipf/$mode-$n
      if [ -f "$dir/result.json" ]; then echo "[bench_tier] $dir: done earlier, kept"; continue; fi
      echo "[bench_tier] $dir ($(uptime | sed 's/.*load/load/'))"
      "${root_env[@]}" TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/horovodrun -np 2 -H localhost:2 --mpi \
        scripts/pin_worker.sh .venv/bin/python benchmarks/tier/bench_tier.py --mode "$mode" --zipf "$zipf" \
        --vocab "$VOCAB" --dram-bytes "$DRAM" --tier-path "$TIER_PATH" --steps "$STEPS" --warmup "$WARMUP" \
        --out "$dir" 2>&1 | grep -E '^(\[[0-9],[0-9]\]<std...>:)?\[bench_tier\]|Traceback|Error:' || true
      [ -f "$dir/result.json" ] || { echo "[bench_tier] $dir: no result" >&2; exit 1; }
    done
  done
done
python3 - "$OUT" "$ZIPFS" <<'PY'
import glob, json, statistics, sys
out, zipfs = sys.argv[1], sys.argv[2].split()
print("| Zipf | DRAM samples/s | tiered samples/s | tiered / DRAM | DRAM hit rate | table rows per worker | cache rows per worker |")
print("|---|---:|---:|---:|---:|---:|---:|")
for z in zipfs:
    runs = {m: [json.load(open(p)) for p in sorted(glob.glob(f"{out}/zipf{z}/{m}-*/result.json"))] for m in ("dram", "tiered")}
    d = statistics.median(r["samples_per_s"] for r in runs["dram"])
    t = statistics.median(r["samples_per_s"] for r in runs["tiered"])
    hit = statistics.median(w["hit_rate"] for r in runs["tiered"] for w in r["per_worker"])
    w = runs["tiered"][0]["per_worker"][0]
    print(f"| {z} | {d:,.0f} | {t:,.0f} | {t / d:.2f}x | {100 * hit:.1f}% | {sum(w['rows']):,} | {w['dram_rows']:,} |")
PY
