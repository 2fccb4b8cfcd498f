"""The custom model of custom_loop.py on two workers: one setup call, equal dense start, a checkpoint written and
restored.

    .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/multi_worker.py [MODEL_DIR]

Each worker reads its own half of every global batch; each table row lives on one worker (its owner), and the
fused all-to-alls bring every worker the rows its examples need. MODEL_DIR (shared by the workers; default
/tmp/tf_fusedrec_example) is emptied first.
"""

import os
import shutil
import sys

import numpy as np

import tf_fusedrec as fr

# The one setup call: under horovodrun or mpirun it initialises Horovod (with the measured Open MPI settings); alone it
# returns a one-worker comm. Before any layer is created.
comm = fr.init_workers()
import tensorflow as tf  # noqa: E402  (after fr's first name, which loads TensorFlow quietly)

MODEL_DIR = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tf_fusedrec_example"
FEATURES = [fr.Feature("user_id", dim=8), fr.Feature("item_id", dim=8), fr.Feature("city", dim=4)]
GLOBAL_BATCH = 64


def say(*args):
    if comm.rank == 0:  # one worker speaks for all
        print(*args, flush=True)


class Ranker(tf.keras.Model):
    def __init__(self, seed):
        super().__init__()
        self.embedding = fr.FusedEmbedding(FEATURES, optimizer={"name": "adagrad", "learning_rate": 0.1})
        # A seed per worker, on purpose: the dense weights start apart, and make_optimizer makes them equal.
        self.hidden = tf.keras.layers.Dense(16, "relu", kernel_initializer=tf.keras.initializers.GlorotUniform(seed))
        self.logit = tf.keras.layers.Dense(1)

    def call(self, inputs, training=None):
        rows = self.embedding(inputs, training=training)
        return self.logit(self.hidden(tf.concat([rows[f.name] for f in FEATURES], axis=1)))[:, 0]


def local_batch(step):
    """This worker's half of the global batch of `step` (a function of the step: a restart reads the same data)."""
    rng = np.random.default_rng(step)
    ids = {f.name: rng.integers(0, 50, GLOBAL_BATCH) for f in FEATURES}
    labels = ((ids["user_id"] + ids["item_id"]) % 2).astype(np.float32)
    mine = slice(comm.rank * GLOBAL_BATCH // comm.size, (comm.rank + 1) * GLOBAL_BATCH // comm.size)
    return {k: tf.constant(v[mine], tf.int64) for k, v in ids.items()}, labels[mine]


def build():
    """A model built on a first batch, its optimizer (dense weights made equal on every worker here: the model is
    built) and the Checkpointer, which saves and restores tables, dense weights, optimizer slots and the step."""
    model = Ranker(seed=comm.rank)
    model(local_batch(0)[0])
    optimizer = fr.train.make_optimizer(model, default={"name": "adam", "learning_rate": 0.01})
    step = tf.Variable(0, dtype=tf.int64)
    return model, optimizer, step, fr.train.Checkpointer(MODEL_DIR, model, optimizer, step, comm)


def dense_weights(model):
    return np.concatenate([w.numpy().ravel() for w in model.hidden.weights + model.logit.weights])


def equal_on_every_worker(values):
    every = comm.allgather(tf.constant(values[None]), name="example/compare").numpy()  # [workers, n]
    return bool((every == every[0]).all())


if comm.rank == 0:
    shutil.rmtree(MODEL_DIR, ignore_errors=True)
comm.allreduce([tf.zeros([1])], name="example/emptied")  # every worker waits for the directory to be emptied

model, optimizer, step, checkpointer = build()
say(f"{comm.size} workers; dense weights equal on every worker at the start: {equal_on_every_worker(dense_weights(model))}")


@tf.function
def train_step(inputs, labels):
    with tf.GradientTape() as tape:
        logits = model(inputs, training=True)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss


for s in range(30):
    loss = train_step(*local_batch(s % 8))
    step.assign_add(1)
    if s % 10 == 0 or s == 29:
        say(f"step {s:3d}  loss (worker 0's half) {float(loss):.4f}")
say(f"dense weights equal on every worker after training: {equal_on_every_worker(dense_weights(model))}")
saved_at = checkpointer.save()
say(f"checkpoint written: {os.path.relpath(saved_at, MODEL_DIR)} in {MODEL_DIR}")
eval_inputs, _ = local_batch(100)
before = model(eval_inputs, training=False).numpy()
weights = dense_weights(model)

# A restarted job: a new model (new tables, other initial weights) restored from the checkpoint.
tf.keras.backend.clear_session()  # frees the layer's table names for the new model
model, optimizer, step, checkpointer = build()
restored = checkpointer.restore()
after = model(eval_inputs, training=False).numpy()
same = bool(np.array_equal(dense_weights(model), weights) and np.array_equal(before, after))
say(f"restored step {restored['step']} (written by {restored['workers']} workers): weights and predictions equal "
    f"the saved ones on every worker: {equal_on_every_worker(np.array([same], np.float32)) and same}")
