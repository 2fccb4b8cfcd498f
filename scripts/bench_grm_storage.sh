#!/usr/bin/env bash
# Row storage of the GRM's tables on grm_synthetic, 2 workers (MTGRBoost §5.2's mixed precision): float32, float16,
# and float16 with the 2000 most read rows per group replicated in float32 (--hot 2000: mixed). Each run trains the
# same batches (--balance none) for STEPS steps; table bytes (rows; optimizer slots apart), held-out AUC per task and samples/s
# -> $OUT/storage_bench.json (the README's table). REPEATS > 1 repeats the three modes in turn (samples/s only
# differs between repeats).
#   scripts/bench_grm_storage.sh [OUT=docs/grm] [REPEATS=1] [STEPS=300] [BATCH=128]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/grm}; REPEATS=${REPEATS:-1}; STEPS=${STEPS:-300}; BATCH=${BATCH:-128}
export TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$OUT/runs"
declare -A MODE_ARGS=([float32]="--table-storage float32" [float16]="--table-storage float16"
                      [mixed]="--table-storage float16 --hot 2000 --hot-sample-batches 20")
for rep in $(seq 1 "$REPEATS"); do
  for mode in float32 float16 mixed; do
    echo "[bench-grm-storage] repeat $rep, $mode" >&2
    # shellcheck disable=SC2086  (the mode's flags are words)
    .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python -m tf_fusedrec.train \
      --config configs/grm_synthetic.yaml --steps "$STEPS" --batch-size "$BATCH" --balance none --no-progress \
      ${MODE_ARGS[$mode]} --summary-json "$OUT/runs/storage-$mode-$rep.json" >/dev/null
  done
done
.venv/bin/python - "$OUT" "$REPEATS" "$STEPS" "$BATCH" <<'PY'
import json, os, sys
out, repeats, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
runs = []
for r in range(1, repeats + 1):
    for mode in ("float32", "float16", "mixed"):
        s = json.load(open(f"{out}/runs/storage-{mode}-{r}.json"))
        runs.append({"repeat": r, "mode": mode, "row_bytes": sum(s["table_bytes_per_worker"]["rows"]),
                     "slot_bytes": sum(s["table_bytes_per_worker"]["slots"]), "auc": s["auc"],
                     "samples_per_s": s["samples_per_s"], "final_loss": s["final_loss"],
                     "hot_rows": [h["rows"] for h in s.get("hot", [])]})
base = {r["repeat"]: r for r in runs if r["mode"] == "float32"}
for r in runs:
    b = base[r["repeat"]]
    r["row_bytes_vs_float32"] = r["row_bytes"] / b["row_bytes"]
    r["all_bytes_vs_float32"] = (r["row_bytes"] + r["slot_bytes"]) / (b["row_bytes"] + b["slot_bytes"])
    r["auc_minus_float32"] = {t: r["auc"][t] - b["auc"][t] for t in r["auc"]}
    r["samples_per_s_vs_float32"] = r["samples_per_s"] / b["samples_per_s"]
result = {"command": f"scripts/bench_grm_storage.sh (REPEATS={repeats} STEPS={steps} BATCH={batch})",
          "load_average_when_summarised": os.getloadavg(), "runs": runs}
json.dump(result, open(f"{out}/storage_bench.json", "w"), indent=1)
print("| mode | row bytes (2 workers) | vs float32 | rows + slots vs float32 | AUC click | AUC conversion | "
      "AUC change (click, conv.) | samples/s vs float32 |")
print("|---|---:|---:|---:|---:|---:|---|---:|")
for r in runs:
    d = r["auc_minus_float32"]
    print(f"| {r['mode']}{' R=' + str(r['hot_rows']) if r['hot_rows'] else ''} | {r['row_bytes']:,} | "
          f"{r['row_bytes_vs_float32']:.2f} | {r['all_bytes_vs_float32']:.2f} | {r['auc']['click']:.4f} | "
          f"{r['auc']['conversion']:.4f} | {d['click']:+.4f}, {d['conversion']:+.4f} | "
          f"{r['samples_per_s_vs_float32']:.2f} |")
PY
