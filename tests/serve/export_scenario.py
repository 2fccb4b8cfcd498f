"""Training then exporting, for tests/serve/test_export.py; runs alone or under horovodrun.

    python tests/serve/export_scenario.py train --layers fused,fused_hot --where DIR
    python tests/serve/export_scenario.py export --layers fused,fused_hot --where DIR

For each layer in turn (one process, or one horovodrun launch, runs them all; a Keras session is cleared between
them), with DIR/{layer} its directory:
train: N workers train a DLRM for STEPS steps on slices of a global batch, checkpoint into DIR/{layer}/model, then
each rank writes DIR/{layer}/out/rank{r}.npz: its slices of EVAL_STEPS held-out batches and the model's scores on
them with training=False.
export: one process builds the same model, restores the checkpoint (any worker count) and writes DIR/{layer}/export.

Features: a packed group (user_id, item_id: max_id_bits), a hashed group (tags: ragged multi-hot with mean, genres:
[B, 3] with -1 padding and sum, country: int32 ids), and history: [B, 2] with padding and no combiner (a sequence).
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import tf_fusedrec as fr  # noqa: E402  (sets TF_USE_LEGACY_KERAS before TensorFlow)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_fusedrec import models  # noqa: E402
from tf_fusedrec.distributed import comm as comm_lib  # noqa: E402
from tf_fusedrec.train.checkpoint import Checkpointer  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests", "distributed"))
import scenario  # noqa: E402  (its local_slice: the slicing of a global batch every distributed test uses)

GLOBAL_BATCH = scenario.GLOBAL_BATCH = 12
local_slice = scenario.local_slice
STEPS = 4
EVAL_STEPS = 2
NUM_DENSE = 3


def make_features():
    opt = {"name": "adagrad", "learning_rate": 0.2}
    return [
        fr.Feature("user_id", dim=4, optimizer=opt, max_id_bits=12),
        fr.Feature("item_id", dim=4, optimizer=opt, max_id_bits=12),
        fr.Feature("tags", dim=8, combiner="mean", optimizer=opt),
        fr.Feature("genres", dim=8, combiner="sum", optimizer=opt),
        fr.Feature("country", dim=8, optimizer=opt, key_dtype=tf.int32),
        fr.Feature("history", dim=4, optimizer="sgd"),
    ]


def make_batch(step):
    """The global batch of a step (steps >= 1000 are held out: ids partly never trained)."""
    rng = np.random.default_rng([3, step])
    b = GLOBAL_BATCH
    span = 40 if step < 1000 else 60
    lengths = rng.integers(0, 4, b)
    lengths[step % b] = 0
    genres = rng.integers(0, span, (b, 3))
    genres[rng.random((b, 3)) < 0.3] = -1
    history = rng.integers(0, span, (b, 2))
    history[rng.random((b, 2)) < 0.2] = -1
    return {
        "dense": rng.normal(size=(b, NUM_DENSE)).astype(np.float32),
        "user_id": rng.integers(0, span, b).astype(np.int64),
        "item_id": rng.integers(0, span, b).astype(np.int64),
        "tags": (rng.integers(0, span, int(lengths.sum())).astype(np.int64), lengths),
        "genres": genres.astype(np.int64),
        "country": rng.integers(0, 20, b).astype(np.int32),
        "history": history.astype(np.int64),
        "label": (rng.random(b) < 0.3).astype(np.float32),
    }


def build(layer, comm):
    features = make_features()
    if layer == "per_feature":
        embedding = fr.PerFeatureEmbedding(features, name="sparse", comm=comm)
    else:
        replication = fr.HotReplication(rows=6, sample_batches=2) if layer == "fused_hot" else None
        embedding = fr.FusedEmbedding(features, name="sparse", comm=comm, replication=replication,
                                      table_backend="tfra" if layer == "fused_tfra" else "native")
    model = models.DLRM(embedding, bottom_mlp=(8, 4), top_mlp=(8,), num_dense=NUM_DENSE)
    opt = fr.train.make_optimizer(model, default={"name": "adam", "learning_rate": 0.05})
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
    features_only = {k: v for k, v in local_slice(make_batch(0), 0, comm.size).items() if k != "label"}
    model(features_only, training=False)
    return model, opt, step, Checkpointer


def inputs_of(batch):
    return {k: v for k, v in batch.items() if k != "label"}


def train(layer, where, comm):
    rank, size = comm.rank, comm.size
    model, opt, step_var, _ = build(layer, comm)
    if layer == "fused_hot":
        from tf_fusedrec.distributed import replication as replication_lib  # noqa: PLC0415

        sample = [{k: v for k, v in local_slice(make_batch(s), rank, size).items() if k not in ("dense", "label")}
                  for s in range(2)]
        replication_lib.choose_hot_set(model.embedding, sample)
    opt.create_slots(model.trainable_variables)  # before step's first call: see scenario.create_variables

    # Without AutoGraph (as TrainPipeline): nothing here needs it, and converting the model's calls cost about 30 s
    # of CPU per process for the four layers (autograph on stays tested in tests/distributed/test_horovod.py).
    @tf.function(autograph=False)
    def step(inputs):
        with tf.GradientTape() as tape:
            scores = model(inputs_of(inputs), training=True)
            loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(inputs["label"][:, None], scores[:, None],
                                                                      from_logits=True))
        variables = model.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    for s in range(STEPS):
        step(local_slice(make_batch(s), rank, size))
        step_var.assign_add(1)
    Checkpointer(os.path.join(where, "model"), model, opt, step_var, comm).save()
    out = {}
    for e in range(EVAL_STEPS):
        batch = local_slice(make_batch(1000 + e), rank, size)
        out[f"eval{e}/scores"] = model(inputs_of(batch), training=False).numpy()
        for k, v in batch.items():
            if isinstance(v, tf.RaggedTensor):
                out[f"eval{e}/{k}/values"], out[f"eval{e}/{k}/lengths"] = v.flat_values.numpy(), v.row_lengths().numpy()
            else:
                out[f"eval{e}/{k}"] = v.numpy()
    os.makedirs(os.path.join(where, "out"), exist_ok=True)
    np.savez(os.path.join(where, "out", f"rank{rank}.npz"), **out)
    if layer == "fused_hot" and rank == 0:
        print(f"hot rows: {[len(h) for h in model.embedding.hot_sets]}")


def export(layer, where, comm, parts):
    model, opt, step_var, checkpointer = build(layer, comm)
    restored = checkpointer(os.path.join(where, "model"), model, opt, step_var, comm).restore()
    example = inputs_of(local_slice(make_batch(0), 0, 1))
    fr.export.export_model(model, os.path.join(where, "export"), example=example, parts=parts,
                           source={"step": restored["step"], "workers": restored["workers"]})


# fused and fused_hot: the layer's default (native) tables; fused_tfra and per_feature: TFRA's (the [tfra] extra).
LAYERS = ("fused", "fused_hot", "fused_tfra", "per_feature")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["train", "export"])
    p.add_argument("--layers", default="fused", help=f"comma-separated, of {', '.join(LAYERS)}")
    p.add_argument("--where", required=True, help="DIR: each layer's model, out and export go to DIR/{layer}")
    p.add_argument("--parts", type=int, default=3)
    args = p.parse_args()
    layers = args.layers.split(",")
    for layer in layers:
        if layer not in LAYERS:
            p.error(f"--layers: unknown layer {layer!r} (expected some of {', '.join(LAYERS)})")
    comm = comm_lib.init_workers() if args.mode == "train" else comm_lib.get_comm("single")
    for layer in layers:
        tf.keras.backend.clear_session()
        where = os.path.join(args.where, layer)
        if args.mode == "train":
            train(layer, where, comm)
        else:
            export(layer, where, comm, args.parts)


if __name__ == "__main__":
    main()
    scenario.exit_now()  # (see there: the teardown costs seconds per process)
