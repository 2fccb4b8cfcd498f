#!/usr/bin/env bash
# configs/movielens1m_seq.yaml on MovieLens-1M-sized made-up ratings (benchmarks/grm/ml1m_like.py: the real data cannot be
# downloaded here), 2 workers, its own batch (128) and token balancing, STEPS steps: the GRM with the attention op
# (9c42fba) against the pair-list form before it (9613e13), alternated. Each run's summary (tokens/s, samples/s) and
# its wall time (the reading of 0.96M ratings included) -> OUT/{pairs,op}-N.json.
#
#   .venv/bin/python benchmarks/grm/ml1m_like.py /tmp/ml1m_like
#   git worktree add /tmp/old_grm 9613e13 && cp tf_fusedrec/ops/_fusedrec_ops.so /tmp/old_grm/tf_fusedrec/ops/
#   OLD=/tmp/old_grm DATA=/tmp/ml1m_like ROUNDS=2 STEPS=100 benchmarks/results/grm/movielens_like/run.sh
set -eu
here=$(cd "$(dirname "$0")/../../../.." && pwd)
out=$here/benchmarks/results/grm/movielens_like
old=${OLD:?the tree of the pair-list attention}
data=${DATA:?a MovieLens-1M-layout directory}
rounds=${ROUNDS:-2}
steps=${STEPS:-100}
export TF_CPP_MIN_LOG_LEVEL=2
config=$(mktemp --suffix .yaml)
trap 'rm -f "$config"' EXIT
sed "s|^  path: data/ml-1m$|  path: $data|" "$here/configs/movielens1m_seq.yaml" > "$config"
grep -q "^  path: $data$" "$config" || { echo "could not set data.path" >&2; exit 1; }
for round in $(seq 1 "$rounds"); do
  for variant in pairs op; do
    tree=$here
    [ "$variant" = pairs ] && tree=$old
    began=$(date +%s.%N)
    (cd "$tree" && "$here/.venv/bin/horovodrun" -np 2 -H localhost:2 --gloo "$here/.venv/bin/python" \
      -m tf_fusedrec.train --config "$config" --steps "$steps" --no-progress \
      --summary-json "$out/$variant-$round.json") >/dev/null 2>&1
    ended=$(date +%s.%N)
    "$here/.venv/bin/python" - "$out/$variant-$round.json" "$began" "$ended" "$steps" <<'PY'
import json, sys
path, began, ended, steps = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
s = json.load(open(path))
s["wall_s"] = ended - began
json.dump(s, open(path, "w"), indent=1)
print(f"{path}: {s['tokens_per_s']:,.0f} tokens/s, {s['samples_per_s']:,.0f} samples/s, {steps} steps in "
      f"{s['wall_s']:.0f} s of wall time")
PY
  done
done
