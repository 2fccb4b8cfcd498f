#!/usr/bin/env bash
# The GRM's attention as one op (9c42fba) against the pair-list form before it (9613e13), alternated on one machine:
# benchmarks/profiling/grm_op_profile.py (one worker, in process: step time, tokens/s and the op profile) at median history
# lengths 32 (grm_synthetic's) and 100 (capped at 200, movielens1m_seq.yaml's cap), and the train app on 2 workers
# (configs/grm_synthetic.yaml, 100 steps of 128, --balance none: the summary's tokens/s).
#
#   git worktree add /tmp/old_grm 9613e13 && cp tf_fusedrec/ops/_fusedrec_ops.so /tmp/old_grm/tf_fusedrec/ops/ \
#     && mkdir -p /tmp/old_grm/benchmarks/profiling \
#     && cp benchmarks/profiling/{grm_op_profile,op_profile}.py /tmp/old_grm/benchmarks/profiling/
#   OLD=/tmp/old_grm ROUNDS=3 benchmarks/results/grm/profile/run.sh
set -eu
here=$(cd "$(dirname "$0")/../../../.." && pwd)
out=$here/benchmarks/results/grm/profile
old=${OLD:?the tree of the pair-list attention}
rounds=${ROUNDS:-3}
py=$here/.venv/bin/python
export TF_CPP_MIN_LOG_LEVEL=2
for round in $(seq 1 "$rounds"); do
  for variant in pairs op; do
    tree=$here
    [ "$variant" = pairs ] && tree=$old
    for median in 32 100; do
      (cd "$tree" && "$py" benchmarks/profiling/grm_op_profile.py --median "$median" --out "$out/$variant-median$median-$round.json") \
        2>/dev/null | head -1
    done
    (cd "$tree" && "$here/.venv/bin/horovodrun" -np 2 -H localhost:2 --gloo "$py" -m tf_fusedrec.train \
      --config configs/grm_synthetic.yaml --steps 100 --batch-size 128 --balance none --no-progress \
      --summary-json "$out/$variant-train2-$round.json") >/dev/null 2>&1
    echo "round $round $variant train: $(python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(round(s['tokens_per_s']), 'tokens/s', round(s['samples_per_s']), 'samples/s')" "$out/$variant-train2-$round.json")"
  done
done
