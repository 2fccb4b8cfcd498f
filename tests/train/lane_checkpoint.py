"""A checkpoint written on one tested stack, restored on the other (issue 54): the model, its data and its training.

    python tests/train/lane_checkpoint.py write DIR      # the baseline lane (TF 2.16.2, Keras 2) wrote the fixture

writes DIR/start (a checkpoint after START_STEPS steps), DIR/after (the checkpoint after CONTINUE_STEPS more steps,
trained on from DIR/start's state in the same process) and DIR/losses.json (the losses of those further steps).
tests/train/test_lane_checkpoint.py restores DIR/start on whichever stack runs it, trains the same CONTINUE_STEPS
and compares its losses and its own checkpoint of the end (rows, optimizer slot rows, dense weights and dense slots,
array by array) with the fixture's.

The model: a DLRM on two native table groups (Adam; Adagrad, a ragged bag with mean) and dense Adam, one worker:
every kind of state a checkpoint holds (rows, per-table slots, dense slots keyed by tf_keras' slot names on either
Keras: tf_fusedrec/_keras.py dense_slots).
"""

import json
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import tf_fusedrec as fr  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_fusedrec import models  # noqa: E402
from tf_fusedrec.distributed import comm as comm_lib  # noqa: E402
from tf_fusedrec.train.checkpoint import Checkpointer  # noqa: E402

START_STEPS = 3
CONTINUE_STEPS = 3
BATCH = 16
NUM_DENSE = 3


def make_features():
    return [
        fr.Feature("user_id", dim=4, optimizer={"name": "adam", "learning_rate": 0.05}),
        fr.Feature("item_id", dim=4, optimizer={"name": "adam", "learning_rate": 0.05}),
        fr.Feature("tags", dim=8, combiner="mean", optimizer={"name": "adagrad", "learning_rate": 0.2}),
    ]


def make_batch(step):
    rng = np.random.default_rng([54, step])
    lengths = rng.integers(0, 4, BATCH)
    return {
        "dense": rng.normal(size=(BATCH, NUM_DENSE)).astype(np.float32),
        "user_id": rng.integers(0, 30, BATCH).astype(np.int64),
        "item_id": rng.integers(0, 30, BATCH).astype(np.int64),
        "tags": tf.RaggedTensor.from_row_lengths(rng.integers(0, 30, int(lengths.sum())).astype(np.int64), lengths),
        "label": (rng.random(BATCH) < 0.4).astype(np.float32),
    }


def build():
    """-> (model, optimizer, step variable), every variable created (in a fresh Keras session: the layer's name is
    taken once per session)."""
    tf.keras.backend.clear_session()
    embedding = fr.FusedEmbedding(make_features(), name="sparse", comm="single")
    model = models.DLRM(embedding, bottom_mlp=(8, 4), top_mlp=(8,), num_dense=NUM_DENSE)
    opt = fr.train.make_optimizer(model, default={"name": "adam", "learning_rate": 0.01})
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
    model({k: v for k, v in make_batch(0).items() if k != "label"}, training=False)
    opt.create_slots(model.trainable_variables)
    return model, opt, step


def checkpointer(model_dir, model, opt, step):
    return Checkpointer(model_dir, model, opt, step, comm_lib.get_comm("single"))


def train(model, opt, step, steps):
    """Trains `steps` steps from the step variable's value on -> their losses."""
    @tf.function(autograph=False)
    def one(batch):
        inputs = {k: v for k, v in batch.items() if k != "label"}
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(batch["label"], logits))
        variables = model.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    losses = []
    for _ in range(steps):
        losses.append(float(one(make_batch(int(step.numpy())))))
        step.assign_add(1)
    return losses


def continue_from(start_dir, after_dir):
    """Restores the newest checkpoint of start_dir, trains CONTINUE_STEPS and checkpoints into after_dir -> the
    losses. start_dir is only read (the checkpoint is copied to after_dir first)."""
    shutil.copytree(start_dir, after_dir)
    model, opt, step = build()
    saver = checkpointer(after_dir, model, opt, step)
    restored = saver.restore()
    if restored is None or restored["step"] != START_STEPS:
        raise AssertionError(f"{start_dir}: restored {restored}, expected the checkpoint of step {START_STEPS}")
    losses = train(model, opt, step, CONTINUE_STEPS)
    saver.save()
    return losses


def write(where):
    """The fixture: DIR/start, DIR/after, DIR/losses.json (module docstring)."""
    os.makedirs(where, exist_ok=True)
    model, opt, step = build()
    train(model, opt, step, START_STEPS)
    checkpointer(os.path.join(where, "start"), model, opt, step).save()
    losses = continue_from(os.path.join(where, "start"), os.path.join(where, "after"))
    shutil.rmtree(os.path.join(where, "after", f"ckpt-{START_STEPS}"))  # the copy of start's
    keras = "Keras 2 (tf_keras)" if fr._keras.legacy() else "Keras 3"  # noqa: SLF001
    with open(os.path.join(where, "losses.json"), "w") as f:
        json.dump({"tensorflow": tf.__version__, "keras": keras, "losses": losses}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "write":
        sys.exit(__doc__.split("\n\n")[1])
    write(sys.argv[2])
