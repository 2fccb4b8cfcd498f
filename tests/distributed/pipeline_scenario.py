"""Trains the distributed scenario's model (tests/distributed/scenario.py) with fr.train.TrainPipeline under several
schedules in one process, one model per schedule, all from the same initial state on the same finite data.

    python tests/distributed/pipeline_scenario.py --optimizer adagrad --encoding hashed --out DIR \
        --schedules sync,dbp,fwp2,fwp4c
    horovodrun -np 2 -H localhost:2 --gloo python tests/distributed/pipeline_scenario.py ...
    python tests/distributed/pipeline_scenario.py --run="--schedules sync,dbp --out DIR1" \
        --run="--optimizer sgd --encoding packed --schedules sync,fwp4c --out DIR2"

A schedule is sync, dbp, fwpK (fwp with K micro-batches) or fwpKc (with sample clustering), optionally followed by
_kN: N steps per call (TrainPipeline(steps_per_call=N), trained through progress_many). The data is a finite
dataset of --steps batches, so the pipelines' first step (nothing prefetched) and last step (nothing to prefetch)
both run. With --bad-step S, batch S holds a negative id; every pipeline must then stop at step S with the layer's
error and leave the tables as they were after step S - 1.

Writes DIR/rank{r}.npz with, per schedule X: X/losses, X/kernel, X/bias, X/table/{feature}/{id} rows this worker
holds, X/slot/{name}/{feature}/{id} their optimizer slots, X/error (the error text, when one was raised).

--run FLAGS (repeatable) trains several runs in one launch, one after another (the tests' way: the processes,
TensorFlow's import and Horovod's start are paid once): FLAGS are the single-run flags above, --out included, in one
shell-quoted string (give it as --run="FLAGS": the value starts with a dash). Each run gets a fresh Keras session and
its own layer name (sparse, sparse_1, ...: TFRA tables of the same name would share their rows), which shows in no
output (tables and collectives are named after it; the saved keys name schedules, features and slots, and the
errors name features and ranks).
"""

import argparse
import os
import shlex
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import numpy as np  # noqa: E402

import tf_fusedrec as fr  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenario as sc  # noqa: E402

IDS = np.arange(12, dtype=np.int64)


class PredictionModel(sc.Model):
    """The scenario's model, returning the predictions only (what a pipeline's loss takes)."""

    def call(self, inputs, training=None):
        return super().call(inputs, training=training)[0]


def mse(labels, predictions):
    return tf.reduce_mean(tf.square(predictions - labels))


def parse_schedule(name):
    """"sync" | "dbp" | "fwpK" | "fwpKc", then optionally "_kN" -> (schedule, micro_batches, cluster_samples,
    steps_per_call)."""
    name, _, per_call = name.partition("_k")
    steps_per_call = int(per_call) if per_call else 1
    if name in ("sync", "dbp"):
        return name, 1, False, steps_per_call
    cluster = name.endswith("c")
    return "fwp", int(name[3:-1] if cluster else name[3:]), cluster, steps_per_call


def dataset(steps, rank, size, bad_step=None, bad_rank=None):
    features = [f.name for f in sc.make_features("sgd")]

    def batches():
        for step in range(steps):
            batch = sc.local_slice(sc.make_batch(step), rank, size)
            if step == bad_step and bad_rank in (None, rank):
                batch["user_id"] = tf.concat([[-5], batch["user_id"][1:]], axis=0)
            labels = batch.pop("label")
            yield batch, labels

    example, _ = next(iter(batches()))
    signature = ({n: tf.type_spec_from_value(example[n]) for n in features}, tf.TensorSpec([None], tf.float32))
    signature[0]["tags"] = tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64)
    return tf.data.Dataset.from_generator(batches, output_signature=signature)


def slot_rows(optimizer, layer, feature, ids):
    """{slot name: rows this worker holds for (feature, id) (None where absent)} of the feature's group."""
    group_index = next(i for i, g in enumerate(layer.groups) if feature in g.feature_names)
    group = layer.groups[group_index]
    segments = np.full(len(ids), group.feature_names.index(feature), np.int32)
    keys = fr.ops.category_unique(ids, segments, group.num_categories, group.encoding).unified_keys
    out = {}
    for name, slot in optimizer.slot_tables(layer.tables[group_index].trainable):  # either backend's slots
        values, exists = slot.lookup(keys, return_exists=True)
        out[name] = [v if e else None for v, e in zip(values.numpy(), exists.numpy())]
    return out


def train(name, args, rank, size, layer_name="sparse"):
    schedule, micro_batches, cluster, steps_per_call = parse_schedule(name)
    optimizer_spec = {"name": args.optimizer, "learning_rate": 0.1}
    features = sc.make_features(optimizer_spec, max_id_bits=20 if args.encoding == "packed" else None)
    with tf.compat.v1.variable_scope(name):
        layer = fr.FusedEmbedding(features, name=layer_name)
    model = PredictionModel(layer)
    optimizer = fr.train.make_optimizer(model, default={"name": "sgd", "learning_rate": 0.1})
    sc.create_variables(model, optimizer, features)  # the pipeline's first step then creates none: traced once
    pipe = fr.train.TrainPipeline(model, optimizer, mse, dataset(args.steps, rank, size, args.bad_step, args.bad_rank),
                                  schedule=schedule, micro_batches=micro_batches, cluster_samples=cluster,
                                  steps_per_call=steps_per_call)
    result, losses = {}, []
    try:
        while True:
            losses.extend(pipe.progress_many().numpy().tolist())
    except StopIteration:
        pass
    except (tf.errors.InvalidArgumentError, ValueError) as e:
        result["error"] = np.array(str(e))
    result.update(losses=np.array(losses), kernel=model.dense.kernel.numpy(), bias=model.dense.bias.numpy())
    for f in features:
        for i, row in zip(IDS, sc.table_rows(layer, f.name, IDS)):
            if row is not None:
                result[f"table/{f.name}/{i}"] = row
        for slot, rows in slot_rows(optimizer, layer, f.name, IDS).items():
            for i, row in zip(IDS, rows):
                if row is not None:
                    result[f"slot/{slot}/{f.name}/{i}"] = row
    return result


def add_run_flags(p):
    """The flags of one run (without --out)."""
    p.add_argument("--optimizer", default="adagrad")
    p.add_argument("--encoding", choices=["hashed", "packed"], default="hashed")
    p.add_argument("--schedules", default="sync,dbp,fwp2")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--bad-step", type=int)
    p.add_argument("--bad-rank", type=int, help="only this rank's batch --bad-step is bad (default: every rank's)")


class _RunParser(argparse.ArgumentParser):
    """Parses one --run value; its errors become the --run flag's error."""

    def error(self, message):
        raise argparse.ArgumentTypeError(message)


def parse_run(text):
    """'--optimizer ... --out DIR' (a --run value) -> the run's flags (argparse.Namespace)."""
    p = _RunParser(prog="--run", add_help=False)
    add_run_flags(p)
    p.add_argument("--out", required=True)
    try:
        return p.parse_args(shlex.split(text))
    except (ValueError, argparse.ArgumentTypeError) as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None


def main():
    p = argparse.ArgumentParser()
    add_run_flags(p)
    p.add_argument("--out", help="the result directory of the one run the flags above describe")
    p.add_argument("--run", action="append", type=parse_run, default=[],
                   help="FLAGS: the flags of one run, --out included, in one string; repeatable; replaces the "
                        "flags above")
    args = p.parse_args()
    single = {k: v for k, v in vars(args).items() if k != "run"}
    if args.run and any(v != p.get_default(k) for k, v in single.items()):
        p.error("--run replaces the single-run flags: give them inside each --run")
    if not args.run and not args.out:
        p.error("give either --out (one run) or one or more --run")
    runs = args.run or [argparse.Namespace(**single)]

    rank, size = sc.init_workers()
    for index, run in enumerate(runs):
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(run).items() if v is not None)
        print(f"[pipeline_scenario] rank {rank}: run {index + 1}/{len(runs)}: {flags}", flush=True)
        tf.keras.backend.clear_session()
        run_one(run, rank, size, layer_name="sparse" if index == 0 else f"sparse_{index}")


def run_one(args, rank, size, layer_name):
    """Trains each schedule of one run (args: its flags) with layers named `layer_name` (one variable scope per
    schedule); writes args.out/rank{r}.npz."""
    saved = {}
    for name in args.schedules.split(","):
        for key, value in train(name, args, rank, size, layer_name).items():
            saved[f"{name}/{key}"] = value
    sc.save_rank(args.out, rank, saved)


if __name__ == "__main__":
    main()
    sc.exit_now()  # (see there: the teardown costs seconds per process)
