#!/usr/bin/env bash
# Token-balanced vs fixed-count batches on grm_synthetic, 2 workers, alternating modes in one run (REPEATS pairs):
# samples/s, tokens/s and token imbalance of each run -> $OUT/balance_bench.json (the README's table).
#   benchmarks/grm/bench_grm_balance.sh [OUT=benchmarks/results/grm] [REPEATS=3] [STEPS=40] [BATCH=128]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/results/grm}; REPEATS=${REPEATS:-3}; STEPS=${STEPS:-40}; BATCH=${BATCH:-128}
export TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$OUT/runs"
for rep in $(seq 1 "$REPEATS"); do
  for balance in tokens none; do
    echo "[bench-grm] repeat $rep, --balance $balance" >&2
    .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python -m tf_fusedrec.train \
      --config configs/grm_synthetic.yaml --steps "$STEPS" --batch-size "$BATCH" --balance "$balance" --no-progress \
      --summary-json "$OUT/runs/$balance-$rep.json" >/dev/null
  done
done
.venv/bin/python - "$OUT" "$REPEATS" "$STEPS" "$BATCH" <<'PY'
import json, os, sys
out, repeats, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
keys = ("samples_per_s", "tokens_per_s", "token_imbalance", "samples_per_worker", "final_loss", "auc")
runs = [{"repeat": r, "balance": b, **{k: json.load(open(f"{out}/runs/{b}-{r}.json"))[k] for k in keys}}
        for r in range(1, repeats + 1) for b in ("tokens", "none")]
ratios = [runs[2 * i]["samples_per_s"] / runs[2 * i + 1]["samples_per_s"] for i in range(repeats)]
result = {"command": f"benchmarks/grm/bench_grm_balance.sh (REPEATS={repeats} STEPS={steps} BATCH={batch})",
          "load_average_when_summarised": os.getloadavg(), "runs": runs, "samples_per_s_ratio_tokens_over_none": ratios}
json.dump(result, open(f"{out}/balance_bench.json", "w"), indent=1)
print("| repeat | balance | samples/s | tokens/s | token imbalance | samples per worker |")
print("|---|---|---:|---:|---:|---|")
for r in runs:
    print(f"| {r['repeat']} | {r['balance']} | {r['samples_per_s']:.0f} | {r['tokens_per_s']:.0f} | "
          f"{r['token_imbalance']:.3f} | {r['samples_per_worker']['total']} |")
print("tokens / none samples/s per repeat: " + ", ".join(f"{x:.2f}x" for x in ratios))
PY
