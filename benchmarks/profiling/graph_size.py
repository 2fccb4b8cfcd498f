"""The size of a training step's graph, and the CPU seconds to build and trace it, per bench mode (one worker).

    .venv/bin/python benchmarks/profiling/graph_size.py --modes fused,fused_chain --out benchmarks/results/perf/step_cost/graph-head.json

Builds each mode's model and TrainPipeline on criteo_synthetic (tf_fusedrec.bench's Runner), runs one step (which
traces it) and counts the ops of the step's graph, nested functions (gradients) included, by type. CPU seconds are
this process's, from building the mode to the end of its first step; each mode runs --repeats times, alternating.
"""

import argparse
import collections
import json
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TYPES = ("Assert", "If", "GatherV2", "UnsortedSegmentSum", "Where", "FusedRec>GatherSegmentSum",
         "FusedRec>UpperTriangle", "FusedRec>DotInteraction", "FusedRec>DotInteractionGrad")


def step_ops(concrete):
    graph = concrete.graph
    ops = list(graph.get_operations())
    for f in graph._functions.values():  # noqa: SLF001  (nested functions, e.g. gradients)
        ops.extend(f.graph.get_operations() if hasattr(f, "graph") else [])
    return ops


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="fused")
    p.add_argument("--config", default="configs/criteo_synthetic.yaml")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    from tf_fusedrec import config as cfg  # noqa: PLC0415
    from tf_fusedrec.bench import train_bench  # noqa: PLC0415
    from tf_fusedrec.distributed import comm as comm_lib  # noqa: PLC0415
    from tf_fusedrec.train import experiment  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    comm = comm_lib.init_workers()
    config = cfg.load_config(args.config)
    batches = experiment.make_dataset(config, config.train.batch_size, comm.rank, comm.size).take(2).cache()
    results = {}
    for _ in range(args.repeats):
        for mode in args.modes.split(","):
            # A mode built again reuses its table names: TFRA's variable store must forget the previous build.
            tf.keras.backend.clear_session()
            began = time.process_time()
            runner = train_bench.Runner(mode, config, batches, comm, None)
            runner.run(1)
            seconds = time.process_time() - began
            ops = step_ops(runner.pipeline.concrete_step())
            counts = collections.Counter(op.type for op in ops)
            entry = results.setdefault(mode, {"ops": len(ops), "by_type": {t: counts[t] for t in TYPES},
                                              "build_trace_step_cpu_seconds": []})
            entry["build_trace_step_cpu_seconds"].append(round(seconds, 3))
            print(f"{mode}: {len(ops)} ops, {seconds:.2f} CPU s", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"config": args.config, "modes": results}, f, indent=1)


if __name__ == "__main__":
    main()
