"""Where one worker's step time goes, by TensorFlow op type: TensorFlow's profiler over steady steps of bench modes.

    .venv/bin/python benchmarks/profiling/op_profile.py --modes fused,dense_only --steps 20 --out benchmarks/results/perf/op_profile/ops.json

Under horovodrun every worker profiles its own steps and rank 0 writes --out.

Builds each mode as tf_fusedrec.bench does (its Runner, criteo_synthetic, one worker; with --hot R the fused_hot
modes replicate R rows per group), warms it up, then traces
--steps steps with tf.profiler and sums, per op type, the time of the op events on TensorFlow's executor threads
(the host plane's "TensorFlow Ops" events; nested events, such as a function call's ops, count in their own type as
well as in the call's). Writes --out as {mode: {"step_ms": ..., "cpu_ms_per_step": ..., "ops": {type: {"ms_per_step",
"count_per_step"}}}}, and prints the largest types.
"""

import argparse
import collections
import glob
import json
import os
import tempfile
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def op_times(logdir, steps):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: PLC0415

    paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise RuntimeError(f"no profile written under {logdir}")
    space = xplane_pb2.XSpace()
    with open(paths[0], "rb") as f:
        space.ParseFromString(f.read())
    total = collections.defaultdict(float)
    count = collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            if "TensorFlow Ops" not in line.name and not line.name.startswith("tf_"):
                continue
            for event in line.events:
                name = names.get(event.metadata_id, "?")
                kind = name.split(":")[-1] if ":" in name else name
                total[kind] += event.duration_ps / 1e9
                count[kind] += 1
    return {k: {"ms_per_step": total[k] / steps, "count_per_step": count[k] / steps}
            for k in sorted(total, key=total.get, reverse=True)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="fused,dense_only")
    p.add_argument("--config", default="configs/criteo_synthetic.yaml")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--hot", default=None, metavar="R",
                   help="fused_hot modes: R rows per group replicated, or auto (the model's choice), chosen on 20 "
                        "later batches; default: no replication")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import tensorflow as tf  # noqa: PLC0415

    from tf_fusedrec import config as cfg  # noqa: PLC0415
    from tf_fusedrec.bench import train_bench  # noqa: PLC0415
    from tf_fusedrec.distributed import comm as comm_lib  # noqa: PLC0415
    from tf_fusedrec.train import experiment  # noqa: PLC0415

    comm = comm_lib.init_workers()
    config = cfg.load_config(args.config)
    batches = experiment.make_dataset(config, config.train.batch_size, comm.rank, comm.size).take(8).cache()
    replication = hot_sample = None
    if args.hot is not None:
        from tf_fusedrec.distributed.replication import HotReplication  # noqa: PLC0415

        replication = HotReplication(rows=None if args.hot == "auto" else int(args.hot), sample_batches=20)
        hot_sample = experiment.embedding_sample(config, config.train.batch_size, comm.rank, comm.size, 8, 20)
    results = {}
    for mode in args.modes.split(","):
        runner = train_bench.Runner(mode, config, batches, comm, None, hot_sample, replication)
        runner.run(args.warmup)
        t0, c0 = time.perf_counter(), time.process_time()
        runner.run(args.steps)
        step_ms, cpu_ms = (1e3 * (time.perf_counter() - t0) / args.steps,
                           1e3 * (time.process_time() - c0) / args.steps)
        with tempfile.TemporaryDirectory() as logdir:
            tf.profiler.experimental.start(logdir)
            runner.run(args.steps)
            tf.profiler.experimental.stop()
            ops = op_times(logdir, args.steps)
        results[mode] = {"step_ms": step_ms, "cpu_ms_per_step": cpu_ms, "ops": ops}
        if runner.hot is not None:
            results[mode]["hot"] = [{"group": r["group"], "rows": int(r["rows"])} for r in runner.hot]
        if comm.rank != 0:
            continue
        print(f"{mode}: {step_ms:.1f} ms/step, CPU {cpu_ms:.1f} ms/step (unprofiled steps); op time by type, ms/step:")
        for kind, v in list(ops.items())[:25]:
            print(f"  {kind:40s} {v['ms_per_step']:8.3f}  x{v['count_per_step']:.0f}")
    if comm.rank != 0:  # under horovodrun every worker profiles its own steps; rank 0's are written
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"config": config.name, "workers": comm.size, "steps": args.steps, "modes": results}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
