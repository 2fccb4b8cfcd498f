#!/bin/bash
# alternates the tree before fused_sender_hot ($BEFORE, default /tmp/ci57: a checkout of 8cfcc62) and after (this
# repository), fused vs fused_hot: RUNS="1 2 3 4 5" HOTS="0 2000 auto" benchmarks/results/bench/hot_sender_1127/run.sh
head=$(cd "$(dirname "$0")/../../../.." && pwd)
out=$head/benchmarks/results/bench/hot_sender_1127
for n in $RUNS; do
  for hot in $HOTS; do
    for tree in before after; do
      dir=$head; [ $tree = before ] && dir=${BEFORE:-/tmp/ci57}
      cd $dir && env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 .venv/bin/horovodrun -np 2 -H localhost:2 --mpi \
        scripts/pin_worker.sh .venv/bin/python -m tf_fusedrec.bench --modes fused,fused_hot --hot $hot --sweep '' \
        --steps 15 --repeats 3 --warmup 10 --out $out/$tree-hot$hot-run$n > $out/$tree-hot$hot-run$n.log 2>&1
      echo "$(date +%T) $tree hot=$hot run $n rc=$?"
    done
  done
done
