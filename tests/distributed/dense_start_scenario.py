"""Dense weights that start apart on each worker: a small model whose dense layers each worker initialises with its own
seed (--seed + rank), trained with fr.train.make_optimizer; runs alone or under horovodrun.

    python tests/distributed/dense_start_scenario.py --out DIR
    horovodrun -np 2 -H localhost:2 --gloo python tests/distributed/dense_start_scenario.py --out DIR

Each worker takes its contiguous slice of a deterministic global batch. For each way of training (MODES) it writes
DIR/{mode}/rank{r}.npz: `start` (the dense weights it initialised, flattened; "built" only: the other modes create
them in their first step), `dense` (the dense weights after training), `losses` (its local loss per step) and
`eval_loss` (the loss on a held-out global batch, training=False, the same batch on every worker).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import numpy as np  # noqa: E402

import tf_fusedrec as fr  # noqa: E402
import tensorflow as tf  # noqa: E402

GLOBAL_BATCH, VOCAB, STEPS = 16, 40, 4
FEATURES = ("item", "user")
# built: the model is built (called once) before make_optimizer, which makes its dense weights equal at once;
# loop: a custom loop in a tf.function builds it in its first step; fit: model.fit on a model built after
# make_optimizer. The last two make them equal before their first update.
MODES = ("built", "loop", "fit")


def global_batch(step):
    rng = np.random.default_rng([7, step])
    ids = {f: rng.integers(0, VOCAB, GLOBAL_BATCH).astype(np.int64) for f in FEATURES}
    labels = ((ids["item"] + ids["user"]) % 3 == 0).astype(np.float32)[:, None]
    return ids, labels


def local_batch(step, rank, size):
    ids, labels = global_batch(step)
    lo, hi = rank * GLOBAL_BATCH // size, (rank + 1) * GLOBAL_BATCH // size
    return {f: tf.constant(v[lo:hi]) for f, v in ids.items()}, tf.constant(labels[lo:hi])


class Model(tf.keras.Model):
    def __init__(self, embedding, seed):
        super().__init__()
        self.embedding = embedding
        self.hidden = tf.keras.layers.Dense(8, activation="relu",
                                            kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed),
                                            bias_initializer=tf.keras.initializers.RandomNormal(seed=seed + 1000))
        self.out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + 2000))

    def call(self, inputs, training=None):
        rows = self.embedding(inputs, training=training)
        return self.out(self.hidden(tf.concat([rows[f] for f in FEATURES], axis=1)))


def dense_weights(model):
    return np.concatenate([np.asarray(v).ravel() for v in model.hidden.weights + model.out.weights])


def loss_fn(labels, logits):
    return tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, logits, from_logits=True))


def train(mode, rank, size, seed):
    layer = fr.FusedEmbedding([fr.Feature(f, dim=4) for f in FEATURES], optimizer={"name": "adagrad",
                                                                                    "learning_rate": 0.1},
                              name=f"sparse_{mode}")
    model = Model(layer, seed)
    start = None
    if mode == "built":
        model(local_batch(0, rank, size)[0])
        start = dense_weights(model)
    optimizer = fr.train.make_optimizer(model, default={"name": "adam", "learning_rate": 0.05})
    losses = []
    if mode == "fit":
        model(local_batch(0, rank, size)[0])
        model.compile(optimizer=optimizer, loss=loss_fn)

        class Losses(tf.keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                losses.append(float(logs["loss"]))

        batches = [local_batch(s, rank, size) for s in range(STEPS)]
        data = tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=(
            {f: tf.TensorSpec([None], tf.int64) for f in FEATURES}, tf.TensorSpec([None, 1], tf.float32)))
        model.fit(data, epochs=1, verbose=0, shuffle=False, callbacks=[Losses()])
    else:
        @tf.function
        def step(ids, labels):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(ids, training=True))
            variables = model.trainable_variables
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss

        losses = [float(step(*local_batch(s, rank, size))) for s in range(STEPS)]
    ids, labels = global_batch(STEPS)
    eval_loss = float(loss_fn(labels, model({f: tf.constant(v) for f, v in ids.items()}, training=False)))
    return {"start": start if start is not None else np.zeros(0), "dense": dense_weights(model),
            "losses": np.array(losses), "eval_loss": np.array(eval_loss)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=100, help="worker r seeds its dense layers with seed + r")
    args = parser.parse_args()
    comm = fr.init_workers()
    for mode in MODES:
        result = train(mode, comm.rank, comm.size, args.seed + comm.rank)
        os.makedirs(os.path.join(args.out, mode), exist_ok=True)
        np.savez(os.path.join(args.out, mode, f"rank{comm.rank}.npz"), **result)
        tf.keras.backend.clear_session()
    print(f"rank {comm.rank}: done", flush=True)


if __name__ == "__main__":
    main()
