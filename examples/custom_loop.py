"""A custom Keras model with FusedEmbedding, trained on one worker in a custom training loop.

    .venv/bin/python examples/custom_loop.py

Four sparse features (two share a spec, so they are fused into one table group), a small dense head, and a
tf.function training step: the tables are updated by each group's optimizer, the dense weights by Adam.
"""

import numpy as np

import tf_fusedrec as fr

comm = fr.init_workers()  # one worker here; under horovodrun it would initialise Horovod (examples/multi_worker.py)
import tensorflow as tf  # noqa: E402  (after fr's first name, which loads TensorFlow quietly)

FEATURES = [
    fr.Feature("user_id", dim=8),                           # user_id and item_id share (dim, optimizer, initializer):
    fr.Feature("item_id", dim=8),                           # one group, one table, one all-to-all pair per step
    fr.Feature("tags", dim=4, combiner="mean"),             # multi-hot: several ids per example, averaged
    fr.Feature("city", dim=4, optimizer={"name": "sgd", "learning_rate": 0.5}),  # its own optimizer
]


class Ranker(tf.keras.Model):
    """Embeddings of every feature, concatenated, then two dense layers: a click logit per example."""

    def __init__(self):
        super().__init__()
        self.embedding = fr.FusedEmbedding(FEATURES, optimizer={"name": "adagrad", "learning_rate": 0.1})
        self.hidden = tf.keras.layers.Dense(16, activation="relu")
        self.logit = tf.keras.layers.Dense(1)

    def call(self, inputs, training=None):
        rows = self.embedding(inputs, training=training)  # dict: feature name -> [B, dim]
        return self.logit(self.hidden(tf.concat([rows[f.name] for f in FEATURES], axis=1)))[:, 0]


def batch(step, size=64):
    """A synthetic batch: ids drawn from small vocabularies; the label is a rule the model can learn."""
    rng = np.random.default_rng(step)
    users, items = rng.integers(0, 50, size), rng.integers(0, 50, size)
    ids = {"user_id": users, "item_id": items, "city": rng.integers(0, 5, size),
           "tags": tf.ragged.constant([list(rng.integers(0, 20, rng.integers(0, 4))) for _ in range(size)],
                                      dtype=tf.int64)}  # ragged: 0 to 3 tags per example
    labels = ((users + items) % 2).astype(np.float32)
    return {k: tf.constant(v, tf.int64) if isinstance(v, np.ndarray) else v for k, v in ids.items()}, labels


model = Ranker()
# Each group's own optimizer for its table, Adam for the dense weights.
optimizer = fr.train.make_optimizer(model, default={"name": "adam", "learning_rate": 0.01})


@tf.function
def train_step(inputs, labels):
    with tf.GradientTape() as tape:
        logits = model(inputs, training=True)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss


losses = []
for step in range(60):
    losses.append(float(train_step(*batch(step % 8))))  # 8 batches, seen again and again
    if step % 20 == 0:
        print(f"step {step:3d}  loss {losses[-1]:.4f}")
print(f"groups: {[g.feature_names for g in model.embedding.groups]}")
print(f"loss: first {losses[0]:.4f}, last {losses[-1]:.4f} ({'decreased' if losses[-1] < losses[0] else 'did not decrease'})")
