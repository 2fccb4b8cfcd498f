"""FusedEmbedding in a Keras model trained with model.compile / model.fit, on one worker.

    .venv/bin/python examples/keras_fit.py

A plain Keras optimizer is enough here: it updates the dense weights, and when it steps each table applies its own
group's optimizer to the rows the batch read. (On several workers, pass fr.train.make_optimizer(model,
default=<your optimizer>) to compile instead: it also averages the dense gradients and starts the dense weights equal.)
"""

import numpy as np

import tf_fusedrec as fr

comm = fr.init_workers()  # one worker here
import tensorflow as tf  # noqa: E402  (after fr's first name, which loads TensorFlow quietly)

FEATURES = [fr.Feature("user_id", dim=8), fr.Feature("item_id", dim=8), fr.Feature("hour", dim=4)]


class Ranker(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.embedding = fr.FusedEmbedding(FEATURES, optimizer={"name": "adagrad", "learning_rate": 0.1})
        self.hidden = tf.keras.layers.Dense(16, activation="relu")
        self.logit = tf.keras.layers.Dense(1)

    def call(self, inputs, training=None):
        rows = self.embedding(inputs, training=training)
        return self.logit(self.hidden(tf.concat([rows[f.name] for f in FEATURES], axis=1)))


def dataset(examples=2048, batch_size=128):
    """A tf.data pipeline of (feature dict, label) batches; the label is a rule the model can learn."""
    rng = np.random.default_rng(0)
    ids = {"user_id": rng.integers(0, 100, examples), "item_id": rng.integers(0, 100, examples),
           "hour": rng.integers(0, 24, examples)}
    labels = (((ids["user_id"] + ids["item_id"]) % 2) & (ids["hour"] < 16)).astype(np.float32)[:, None]
    return tf.data.Dataset.from_tensor_slices((ids, labels)).batch(batch_size)


model = Ranker()
model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
              loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
history = model.fit(dataset(), epochs=5, verbose=0)
for epoch, loss in enumerate(history.history["loss"]):
    print(f"epoch {epoch}  loss {loss:.4f}")
first, last = history.history["loss"][0], history.history["loss"][-1]
print(f"loss: first {first:.4f}, last {last:.4f} ({'decreased' if last < first else 'did not decrease'})")
print(f"rows per table after training: {[int(t.size()) for t in model.embedding.tables]}")
