"""A small training run used by the distributed tests; runs alone or under horovodrun.

    python tests/distributed/scenario.py --layer fused --optimizer adagrad --steps 20 --out DIR
    horovodrun -np 2 -H localhost:2 --gloo python tests/distributed/scenario.py ... --out DIR
    python tests/distributed/scenario.py --run fused:sgd:20:function:off=DIR1 --run per_feature:sgd:20:eager:on=DIR2

Each worker takes its contiguous slice of a deterministic global batch (so N workers see the union that one
worker sees), trains a linear model on top of the embeddings with the loss averaged over its local batch, and
writes DIR/rank{r}.npz with: the first step's outputs for its slice, the loss per step, held-out predictions
(training=False) after the last step, the dense weights, its
table contents keyed by (feature, id), the forward graph's all-to-all and fused sender op counts, and per-feature
statistics.
"""

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import numpy as np  # noqa: E402

import tf_fusedrec as fr  # noqa: E402
from tf_fusedrec.distributed import group_lookup  # noqa: E402
import tensorflow as tf  # noqa: E402

GLOBAL_BATCH = 16


def make_features(optimizer, max_id_bits=None):
    """max_id_bits set: every group uses the packed encoding (the ids here are < 12)."""
    features = [
        fr.Feature("user_id", dim=4, optimizer=optimizer),
        fr.Feature("item_id", dim=4, optimizer=optimizer),  # same spec as user_id: fused with it
        fr.Feature("tags", dim=3, combiner="mean", optimizer=optimizer),  # ragged multi-hot, empty rows
        fr.Feature("genres", dim=3, combiner="sum", optimizer=optimizer),  # dense multi-hot with -1 padding
        fr.Feature("history", dim=3, optimizer=optimizer),  # [B, L] without combiner
    ]
    if max_id_bits is not None:
        features = [dataclasses.replace(f, max_id_bits=max_id_bits) for f in features]
    return features


def make_batch(step, seed=0):
    """The global batch of a step. Ids collide across categories on purpose (small id ranges)."""
    rng = np.random.default_rng([seed, step])
    b = GLOBAL_BATCH
    lengths = rng.integers(0, 4, b)
    lengths[step % b] = 0  # at least one empty row
    tag_values = rng.integers(0, 12, int(lengths.sum()))
    genres = rng.integers(0, 12, (b, 3))
    genres[rng.random((b, 3)) < 0.3] = -1
    history = rng.integers(0, 12, (b, 2))
    history[rng.random((b, 2)) < 0.2] = -1
    return {
        "user_id": rng.integers(0, 12, b).astype(np.int64),
        "item_id": rng.integers(0, 12, b).astype(np.int64),
        "tags": (tag_values.astype(np.int64), lengths),
        "genres": genres.astype(np.int64),
        "history": history.astype(np.int64),
        "label": rng.random(b).astype(np.float32),
    }


def local_slice(batch, rank, size):
    per = GLOBAL_BATCH // size
    lo, hi = rank * per, (rank + 1) * per
    out = {}
    for k, v in batch.items():
        if k == "tags":
            values, lengths = v
            starts = np.concatenate([[0], np.cumsum(lengths)])
            out[k] = tf.RaggedTensor.from_row_lengths(values[starts[lo]:starts[hi]], lengths[lo:hi])
        else:
            out[k] = tf.constant(v[lo:hi])
    return out


class Model(tf.keras.Model):
    def __init__(self, embedding):
        super().__init__()
        self.embedding = embedding
        self.dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=7))

    def call(self, inputs, training=None):
        out = self.embedding({k: v for k, v in inputs.items() if k != "label"}, training=training)
        parts = [out["user_id"], out["item_id"], out["tags"], out["genres"], tf.reduce_sum(out["history"], axis=1)]
        return self.dense(tf.concat(parts, axis=1))[:, 0], out


def create_variables(model, opt, features):
    """Creates every variable before the first tf.function call (as TrainPipeline does): a function whose first call
    creates variables is traced twice. The dense layer reads the five outputs' widths (Model.call)."""
    model.dense.build([None, sum(f.dim for f in features)])
    opt.create_slots(model.trainable_variables)


def train_step_fn(model, opt):
    """One training step on a batch (squared error, averaged over the local batch) -> the loss."""

    def step(inputs):
        with tf.GradientTape() as tape:
            pred, _ = model(inputs, training=True)
            loss = tf.reduce_mean(tf.square(pred - inputs["label"]))
        variables = model.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    return step


def count_ops(fn, *args, op_type="HorovodAlltoall"):
    graph = fn.get_concrete_function(*args).graph
    return sum(1 for op in graph.get_operations() if op.type == op_type)


count_alltoalls = count_ops


def launched():
    """True under horovodrun (--gloo sets HOROVOD_RANK, --mpi's mpirun OMPI_COMM_WORLD_RANK)."""
    return "HOROVOD_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ


def init_workers():
    """(rank, size): Horovod initialised under horovodrun, (0, 1) when run alone."""
    if not launched():
        return 0, 1
    import horovod.tensorflow as hvd  # noqa: PLC0415

    hvd.init()
    return hvd.rank(), hvd.size()


def exit_now():
    """Ends a scenario process whose runs all finished, skipping Python's teardown: collecting the runs' models,
    graphs and tf.data iterators at exit took 2-20 s of CPU and wall per process after the last result was written
    (a 2-worker pipeline_scenario.py launch: 7 s from its last line to its exit). The package's own exit for its
    command lines (comm.exit_after_success: under Horovod an allreduce first, then Horovod's shutdown). Call it only
    after a normal end: errors keep Python's own exit and status."""
    from tf_fusedrec.distributed import comm  # noqa: PLC0415

    comm.exit_after_success("scenario_done")


def save_rank(out, rank, arrays):
    """Writes this rank's results, {out}/rank{rank}.npz, where the tests read them."""
    os.makedirs(out, exist_ok=True)
    np.savez(os.path.join(out, f"rank{rank}.npz"), **arrays)


def transport():
    """How this worker's collectives travel: "mpi" or "gloo" under Horovod, "none" alone."""
    if not launched():
        return "none"
    import horovod.tensorflow as hvd  # noqa: PLC0415

    return "mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else "unknown"


LAYERS = ["fused", "fused_chain", "fused_packed", "fused_fp16", "fused_fp16s", "fused_tfra", "fused_tfra_fp16s",
          "fused_admission", "per_feature"]
TFRA_LAYERS = ("fused_tfra", "fused_tfra_fp16s", "per_feature")  # the layers on TFRA's tables


def parse_run(text):
    """'layer:optimizer:steps:mode:autograph=DIR' (a --run value) -> dict of run_one's arguments."""
    spec, sep, out = text.partition("=")
    parts = spec.split(":")
    if not sep or not out or len(parts) != 5 or parts[0] not in LAYERS or parts[3] not in ("function", "eager") \
            or parts[4] not in ("on", "off") or not parts[2].isdigit():
        raise argparse.ArgumentTypeError(f"--run {text!r}: expected layer:optimizer:steps:function|eager:on|off=DIR "
                                         f"with layer one of {', '.join(LAYERS)}")
    layer, optimizer, steps, mode, autograph = parts
    return dict(layer=layer, optimizer=optimizer, steps=int(steps), mode=mode, autograph=autograph, out=out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layer", choices=LAYERS, default="fused")
    p.add_argument("--optimizer", default="adagrad")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--mode", choices=["function", "eager"], default="function")
    # "off" traces the tf.functions without AutoGraph (the model has no tensor-dependent Python control flow), which
    # roughly halves a run's time: the distributed tests use it for most runs.
    p.add_argument("--autograph", choices=["on", "off"], default="on")
    p.add_argument("--out", help="the result directory of the one run the flags above describe")
    # Several runs in one launch (the tests' way: the processes, TensorFlow's import and Horovod's start are paid
    # once), one after another, each with a fresh Keras session and its own layer name.
    p.add_argument("--run", action="append", type=parse_run, default=[],
                   help="layer:optimizer:steps:function|eager:on|off=DIR, repeatable; replaces the flags above")
    args = p.parse_args()
    if bool(args.run) == bool(args.out):
        p.error("give either --out (one run) or one or more --run")
    runs = args.run or [dict(layer=args.layer, optimizer=args.optimizer, steps=args.steps, mode=args.mode,
                             autograph=args.autograph, out=args.out)]

    rank, size = init_workers()
    for index, run in enumerate(runs):
        print(f"[scenario] rank {rank}: run {index + 1}/{len(runs)}: {run}", flush=True)
        tf.keras.backend.clear_session()
        # fused_chain: the fused layer sending its keys and combining its rows through the op chains the fused sender
        # and gather_segment_sum ops replace.
        group_lookup.FUSED_SENDER = group_lookup.FUSED_OUTPUT = run["layer"] != "fused_chain"
        run_one(rank, size, name="sparse" if index == 0 else f"sparse_{index}", **run)


def run_one(rank, size, layer, optimizer, steps, mode, autograph, out, name):
    # A few named variants with hyperparameters (tests/distributed/test_native_workers.py), else the plain optimizer.
    variants = {"momentum": {"name": "sgd", "momentum": 0.9, "nesterov": True},
                "rmsprop": {"name": "rmsprop", "momentum": 0.5, "centered": True},
                "ftrl": {"name": "ftrl", "l1_regularization_strength": 0.01, "l2_regularization_strength": 0.01}}
    optimizer = {"learning_rate": 0.1, **variants.get(optimizer, {"name": optimizer})}
    features = make_features(optimizer, max_id_bits=20 if layer == "fused_packed" else None)
    layer_cls = fr.PerFeatureEmbedding if layer == "per_feature" else fr.FusedEmbedding
    # fp16s: float16 rows rounded stochastically (tf_fusedrec/distributed/rounding.py).
    # The fused layers train the layer's default (native) tables, but for the fused_tfra ones (TFRA's tables: the
    # [tfra] extra, as per_feature).
    options = {"fused_fp16": {"storage": "float16"}, "fused_tfra": {"table_backend": "tfra"},
               "fused_fp16s": {"storage": "float16", "rounding": "stochastic"},
               "fused_tfra_fp16s": {"table_backend": "tfra", "storage": "float16", "rounding": "stochastic"},
               "fused_admission": {"table_backend": "native", "admission": fr.Admission(3),
                                   "expiry": fr.Expiry(2, interval=1)}}.get(layer, {})
    model = Model(layer_cls(features, name=name, **options))
    opt = fr.train.make_optimizer(model, default={"name": "sgd", "learning_rate": 0.1})
    create_variables(model, opt, features)

    step = train_step_fn(model, opt)
    autograph = autograph == "on"
    forward = tf.function(lambda inputs: model(inputs, training=True)[1], autograph=autograph)
    train_step = tf.function(step, autograph=autograph) if mode == "function" else step
    first = local_slice(make_batch(0), rank, size)
    outputs = {k: (v.to_tensor() if isinstance(v, tf.RaggedTensor) else v).numpy()
               for k, v in forward(first).items()}
    alltoalls = count_alltoalls(forward, first)
    sender_ops = count_ops(forward, first, op_type="FusedRec>FusedSender")
    output_ops = count_ops(forward, first, op_type="FusedRec>GatherSegmentSum")
    losses = [float(train_step(local_slice(make_batch(s), rank, size)).numpy()) for s in range(steps)]
    stats = {}
    if hasattr(model.embedding, "statistics"):
        stats = {f"stat/{k}/{s}": int(v) for k, d in model.embedding.statistics().items() for s, v in d.items()}
    # Held-out predictions (training=False) after training (after reading the
    # statistics, which are those of the last call): every layer must read each id's row on its owner.
    predict = tf.function(lambda inputs: model(inputs, training=False)[0], autograph=autograph)
    eval_pred = predict(local_slice(make_batch(10_000), rank, size)).numpy()

    tables = {}
    for f in features:
        for ids in [np.arange(12, dtype=np.int64)]:
            rows = table_rows(model.embedding, f.name, ids)
            for i, r in zip(ids, rows):
                if r is not None:
                    tables[f"table/{f.name}/{i}"] = r
    save_rank(out, rank, dict(losses=np.array(losses), alltoalls=alltoalls, sender_ops=sender_ops,
                              output_ops=output_ops,
                              eval_pred=eval_pred, kernel=model.dense.kernel.numpy(), bias=model.dense.bias.numpy(),
                              transport=np.array(transport()),
                              **{f"out/{k}": v for k, v in outputs.items()}, **tables, **stats))


def table_rows(layer, feature, ids):
    """Rows this worker holds for (feature, id), None where absent."""
    if isinstance(layer, fr.FusedEmbedding):
        group_index = next(i for i, g in enumerate(layer.groups) if feature in g.feature_names)
        group = layer.groups[group_index]
        segments = np.full(len(ids), group.feature_names.index(feature), np.int32)
        keys = fr.ops.category_unique(ids, segments, group.num_categories, group.encoding).unified_keys
        params = layer.tables[group_index].rows  # float16 storage: the stored rows, as float32
    else:
        keys = tf.constant(ids)
        params = layer.tfra_layer(feature).params
    values, exists = params.lookup(keys, return_exists=True)
    return [v if e else None for v, e in zip(values.numpy(), exists.numpy())]


if __name__ == "__main__":
    main()
    exit_now()
