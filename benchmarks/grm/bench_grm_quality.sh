#!/usr/bin/env bash
# The GRM against a DLRM baseline on the same sequence data (issue 23 item 2): configs/grm_synthetic.yaml (HSTU blocks
# over the history, an MMoE head) and configs/grm_synthetic_dlrm.yaml (the same features, the history a pooled bag,
# a DLRM with one logit per task) train on the same batches of grm_synthetic (same seed, 2 workers, --balance none)
# for STEPS steps and are evaluated on the same EVAL_BATCHES held-out batches per worker; repeated for each data seed
# in SEEDS, the two models alternating. Held-out AUC per task, the GRM's margin over the DLRM, and the training loss
# every 10 steps (rank 0's progress lines) -> $OUT/quality.json (the README's table).
# A run whose summary is already in $OUT/runs is reused (FORCE=1 runs it again).
#   benchmarks/grm/bench_grm_quality.sh [OUT=benchmarks/results/grm/quality] [SEEDS="0 1 2"] [STEPS=300] [BATCH=128] [EVAL_BATCHES=32]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/results/grm/quality}; SEEDS=${SEEDS:-0 1 2}; STEPS=${STEPS:-300}; BATCH=${BATCH:-128}
EVAL_BATCHES=${EVAL_BATCHES:-32}; FORCE=${FORCE:-}
export TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$OUT/runs"
CONFIGS=$(mktemp -d)
trap 'rm -rf "$CONFIGS"' EXIT
declare -A CONFIG=([grm]=configs/grm_synthetic.yaml [dlrm]=configs/grm_synthetic_dlrm.yaml)
for seed in $SEEDS; do
  for model in grm dlrm; do
    config="$CONFIGS/$model-seed$seed.yaml"
    sed -e "s/^  seed: 0$/  seed: $seed/" -e "s/^  eval_batches: 8$/  eval_batches: $EVAL_BATCHES/" \
      "${CONFIG[$model]}" > "$config"
    grep -q "^  seed: $seed$" "$config" && grep -q "^  eval_batches: $EVAL_BATCHES$" "$config" \
      || { echo "could not set the seed or eval_batches in $config" >&2; exit 1; }
    run="$OUT/runs/$model-seed$seed"
    if [ -f "$run.json" ] && [ -z "$FORCE" ]; then
      echo "[bench-grm-quality] seed $seed, $model: reusing $run.json" >&2
      continue
    fi
    echo "[bench-grm-quality] seed $seed, $model" >&2
    .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python -m tf_fusedrec.train --config "$config" \
      --steps "$STEPS" --batch-size "$BATCH" --balance none --steps-per-call 1 --summary-json "$run.json" \
      2>&1 | grep -o 'step [0-9]*/[0-9]* *loss [0-9.]*' > "$run.loss.txt" || true
    [ -f "$run.json" ] || { echo "seed $seed, $model: no summary (the run failed)" >&2; exit 1; }
  done
done
.venv/bin/python - "$OUT" "$SEEDS" "$STEPS" "$BATCH" "$EVAL_BATCHES" <<'PY'
import json, re, sys
import numpy as np
out, seeds = sys.argv[1], [int(s) for s in sys.argv[2].split()]
steps, batch, eval_batches = map(int, sys.argv[3:6])
runs = []
for seed in seeds:
    for model in ("grm", "dlrm"):
        s = json.load(open(f"{out}/runs/{model}-seed{seed}.json"))
        curve = [(int(m.group(1)), float(m.group(2))) for m in
                 re.finditer(r"step (\d+)/\d+ +loss ([0-9.]+)", open(f"{out}/runs/{model}-seed{seed}.loss.txt").read())]
        runs.append({"seed": seed, "model": model, "auc": s["auc"], "final_loss": s["final_loss"],
                     "samples_per_s": s["samples_per_s"], "loss_curve": curve})
by = {(r["seed"], r["model"]): r for r in runs}
margin = {t: [by[s, "grm"]["auc"][t] - by[s, "dlrm"]["auc"][t] for s in seeds] for t in ("click", "conversion")}
result = {"command": f"OUT={out} SEEDS=\"{' '.join(map(str, seeds))}\" STEPS={steps} BATCH={batch} "
                     f"EVAL_BATCHES={eval_batches} benchmarks/grm/bench_grm_quality.sh",
          "workers": 2, "steps": steps, "batch_size_per_worker": batch, "eval_batches_per_worker": eval_batches,
          "runs": runs, "grm_minus_dlrm_auc": margin,
          "mean_grm_minus_dlrm_auc": {t: float(np.mean(v)) for t, v in margin.items()}}
json.dump(result, open(f"{out}/quality.json", "w"), indent=1)
for t, v in margin.items():
    print(f"{t}: GRM - DLRM AUC per seed {[round(x, 4) for x in v]}, mean {np.mean(v):+.4f}")
PY
