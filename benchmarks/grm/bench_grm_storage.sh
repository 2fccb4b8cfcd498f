#!/usr/bin/env bash
# Row storage of the GRM's tables on grm_synthetic, 2 workers (MTGRBoost §5.2's mixed precision): float32, float16
# (each update rounded to nearest), float16s (float16 with stochastic rounding: --table-rounding stochastic), and
# float16 with the 2000 most read rows per group replicated in float32 (--hot 2000: mixed); a fifth run bounds the
# float32 tables by eviction instead (--evict-capacity EVICT rows per group and worker, LFU, every 50 steps). The
# control float32tfra trains float32 on the TFRA backend: the same arithmetic as the native default to ~1e-6, other
# last bits, so its AUC against float32 was meant to measure how far a change of last bits alone moves a 300-step run
# (it came out bit-equal); float32dnnoff (float32 with oneDNN off, below) is that control.
# Each run trains the same batches (--balance none) for STEPS steps and evaluates on EVAL_BATCHES held-out batches per
# worker; the runs repeat for each data seed in SEEDS (a model trained with other rounding follows another
# trajectory: the spread over seeds says how much of an AUC difference is that). Table bytes (rows; optimizer slots
# apart), rows over time, held-out AUC per task -> $OUT/storage_bench.json and the README's table.
# A run whose summary is already in $OUT/runs is reused (FORCE=1 runs it again); MODES picks the modes (float32 is
# the reference of each seed and always included).
#   benchmarks/grm/bench_grm_storage.sh [OUT=benchmarks/results/grm] [SEEDS="0 1"] [MODES="float32 float16 float16s mixed evict"]
#       [STEPS=300] [BATCH=128] [EVAL_BATCHES=32] [EVICT=10000] [FORCE=1] [SUMMARY=storage_bench.json]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/results/grm}; SEEDS=${SEEDS:-0 1}; STEPS=${STEPS:-300}; BATCH=${BATCH:-128}; EVAL_BATCHES=${EVAL_BATCHES:-32}
EVICT=${EVICT:-10000}; SUMMARY=${SUMMARY:-storage_bench.json}; MODES=${MODES:-float32 float16 mixed evict}; FORCE=${FORCE:-}
case " $MODES " in *" float32 "*) ;; *) MODES="float32 $MODES" ;; esac
export TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$OUT/runs"
CONFIGS=$(mktemp -d)
trap 'rm -rf "$CONFIGS"' EXIT
declare -A MODE_ARGS=([float32]="--table-storage float32" [float16]="--table-storage float16"
                      [float16s]="--table-storage float16 --table-rounding stochastic"
                      [float32tfra]="--table-storage float32 --table-backend tfra"
                      [mixed]="--table-storage float16 --hot 2000 --hot-sample-batches 20"
                      [evict]="--evict-capacity $EVICT --evict-interval 50"
                      [float32dnnoff]="--table-storage float32")
# A mode's environment: float32dnnoff runs the float32 model with TensorFlow's oneDNN kernels off (Eigen's matmuls
# and element-wise ops instead: the same model, other last bits in the dense layers and the attention), a control for
# how far a change of last bits alone moves a 300-step run's AUC (float32tfra turned out bit-equal to float32).
declare -A MODE_ENV=([float32dnnoff]="TF_ENABLE_ONEDNN_OPTS=0")
for seed in $SEEDS; do
  sed -e "s/^  seed: 0$/  seed: $seed/" -e "s/^  eval_batches: 8$/  eval_batches: $EVAL_BATCHES/" \
    configs/grm_synthetic.yaml > "$CONFIGS/grm_seed$seed.yaml"
  grep -q "^  seed: $seed$" "$CONFIGS/grm_seed$seed.yaml" && grep -q "^  eval_batches: $EVAL_BATCHES$" \
    "$CONFIGS/grm_seed$seed.yaml" || { echo "could not set the seed or eval_batches" >&2; exit 1; }
  for mode in $MODES; do
    if [ -f "$OUT/runs/storage-$mode-seed$seed.json" ] && [ -z "$FORCE" ]; then
      echo "[bench-grm-storage] seed $seed, $mode: reusing $OUT/runs/storage-$mode-seed$seed.json" >&2
      continue
    fi
    echo "[bench-grm-storage] seed $seed, $mode" >&2
    # shellcheck disable=SC2086  (the mode's flags are words)
    env ${MODE_ENV[$mode]:-} .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python -m tf_fusedrec.train \
      --config "$CONFIGS/grm_seed$seed.yaml" --steps "$STEPS" --batch-size "$BATCH" --balance none --no-progress \
      ${MODE_ARGS[$mode]} --summary-json "$OUT/runs/storage-$mode-seed$seed.json" >/dev/null
  done
done
.venv/bin/python - "$OUT" "$SEEDS" "$STEPS" "$BATCH" "$EVAL_BATCHES" "$EVICT" "$MODES" "$SUMMARY" <<'PY'
import json, os, sys
import numpy as np
out, seeds = sys.argv[1], sys.argv[2].split()
steps, batch, eval_batches, evict = map(int, sys.argv[3:7])
modes = tuple(m for m in ("float32", "float16", "float16s", "mixed", "evict", "float32tfra", "float32dnnoff")
              if m in sys.argv[7].split())
runs = []
for seed in seeds:
    for mode in modes:
        s = json.load(open(f"{out}/runs/storage-{mode}-seed{seed}.json"))
        runs.append({"seed": int(seed), "mode": mode, "row_bytes": sum(s["table_bytes_per_worker"]["rows"]),
                     "slot_bytes": sum(s["table_bytes_per_worker"]["slots"]), "auc": s["auc"],
                     "final_loss": s["final_loss"], "hot_rows": [h["rows"] for h in s.get("hot", [])],
                     "table_rows_over_time": s["table_rows_over_time"], "eviction": s.get("eviction")})
base = {r["seed"]: r for r in runs if r["mode"] == "float32"}
for r in runs:
    b = base[r["seed"]]
    r["row_bytes_vs_float32"] = r["row_bytes"] / b["row_bytes"]
    r["all_bytes_vs_float32"] = (r["row_bytes"] + r["slot_bytes"]) / (b["row_bytes"] + b["slot_bytes"])
    r["auc_minus_float32"] = {t: r["auc"][t] - b["auc"][t] for t in r["auc"]}
summary = {}
for mode in modes:
    mine = [r for r in runs if r["mode"] == mode]
    summary[mode] = {"row_bytes_vs_float32": float(np.mean([r["row_bytes_vs_float32"] for r in mine])),
                     "all_bytes_vs_float32": float(np.mean([r["all_bytes_vs_float32"] for r in mine])),
                     "auc_minus_float32": {t: [r["auc_minus_float32"][t] for r in mine] for t in ("click", "conversion")},
                     "rows_at_end": [sum(w[-1] for w in r["table_rows_over_time"]["rows_per_worker"]) for r in mine]}
result = {"command": f"benchmarks/grm/bench_grm_storage.sh (OUT={out} SEEDS='{' '.join(seeds)}' MODES='{' '.join(modes)}' "
                     f"STEPS={steps} BATCH={batch} EVAL_BATCHES={eval_batches} EVICT={evict})",
          "summary": summary, "runs": runs}
json.dump(result, open(f"{out}/{sys.argv[8]}", "w"), indent=1)
print(f"| mode | rows at the end (2 workers) | row bytes vs float32 | rows + slots vs float32 | "
      f"AUC click - float32, per seed | AUC conversion - float32, per seed |")
print("|---|---:|---:|---:|---|---|")
for mode, m in summary.items():
    hot = [r["hot_rows"] for r in runs if r["mode"] == mode][0]
    print(f"| {mode}{' R=' + str(hot) if hot else ''} | {', '.join(f'{n:,}' for n in m['rows_at_end'])} | "
          f"{m['row_bytes_vs_float32']:.2f} | {m['all_bytes_vs_float32']:.2f} | "
          + " | ".join(", ".join(f"{d:+.4f}" for d in m["auc_minus_float32"][t]) for t in ("click", "conversion"))
          + " |")
print("float32 AUC per seed (click, conversion): " + "; ".join(
    f"{r['auc']['click']:.4f}, {r['auc']['conversion']:.4f}" for r in runs if r["mode"] == "float32"))
for r in runs:
    if r["mode"] == "evict":
        t = r["table_rows_over_time"]
        print(f"rows over time with eviction, seed {r['seed']} (every 10 steps, sum over workers): "
              + ", ".join(str(sum(w[i] for w in t["rows_per_worker"])) for i in range(len(t["steps"]))))
PY
