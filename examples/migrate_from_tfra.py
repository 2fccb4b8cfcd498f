"""Migrating a TFRA per-feature model to FusedEmbedding (the TFRA stack: TensorFlow 2.16, Keras 2, the [tfra] extra).

    TF_USE_LEGACY_KERAS=1 .venv/bin/python examples/migrate_from_tfra.py

Before: one TFRA dynamic embedding layer per sparse feature (HvdAllToAllEmbedding on several workers: one keys and
one embeddings all-to-all per feature per step) and TFRA's optimizer wrapper. After: one FusedEmbedding over the same
features (one all-to-all pair per group of features sharing (dim, optimizer, initializer)) and make_optimizer. The
model's call and training step stay as they were.
"""

import os

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # TFRA needs Keras 2: set before TensorFlow is imported
import tf_fusedrec as fr  # noqa: E402

comm = fr.init_workers()  # one worker here; HvdAllToAllEmbedding would need Horovod initialised the same way
import tensorflow as tf  # noqa: E402  (after fr's first name, which loads TensorFlow quietly)
from tensorflow_recommenders_addons import dynamic_embedding as de  # noqa: E402

tf.get_logger().setLevel("ERROR")  # TFRA logs a deprecation notice per table

NAMES, DIM = ["user_id", "item_id", "category"], 8


class Ranker(tf.keras.Model):
    """The model: whatever `embed` is, a dict name -> [B, DIM] comes out of it."""

    def __init__(self, embed):
        super().__init__()
        self.embed = embed
        self.hidden = tf.keras.layers.Dense(16, activation="relu")
        self.logit = tf.keras.layers.Dense(1)

    def call(self, inputs, training=None):
        rows = self.embed(inputs, training=training)
        return self.logit(self.hidden(tf.concat([rows[n] for n in NAMES], axis=1)))[:, 0]


# --- before: one TFRA layer per feature ----------------------------------------------------------------------------
class PerFeatureTFRA(tf.keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.tables = {n: de.keras.layers.Embedding(DIM, initializer=tf.keras.initializers.RandomNormal(stddev=0.05, seed=i),
                                                    name=f"tfra_{n}") for i, n in enumerate(NAMES)}

    def call(self, inputs, training=None):
        return {n: self.tables[n](inputs[n]) for n in NAMES}


before = Ranker(PerFeatureTFRA())
before_optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.legacy.Adam(0.01))

# --- after: one FusedEmbedding; each feature's optimizer and initializer become its spec ----------------------------
features = [fr.Feature(n, dim=DIM) for n in NAMES]  # equal specs: one group, one table
after = Ranker(fr.FusedEmbedding(features, optimizer={"name": "adam", "learning_rate": 0.01}, name="fused"))
after_optimizer = fr.train.make_optimizer(after, default={"name": "adam", "learning_rate": 0.01})


def batch(step, size=128):
    rng = np.random.default_rng(step)
    ids = {n: rng.integers(0, 40, size) for n in NAMES}
    labels = ((ids["user_id"] + ids["item_id"]) % 2).astype(np.float32)
    return {n: tf.constant(v, tf.int64) for n, v in ids.items()}, tf.constant(labels)


def make_step(model, optimizer):
    @tf.function
    def step(inputs, labels):  # unchanged by the migration
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return step


for name, model, optimizer in (("per-feature TFRA", before, before_optimizer), ("FusedEmbedding", after,
                                                                                 after_optimizer)):
    step = make_step(model, optimizer)
    losses = [float(step(*batch(s % 8))) for s in range(40)]
    print(f"{name:17s} loss: first {losses[0]:.4f}, last {losses[-1]:.4f} "
          f"({'decreased' if losses[-1] < losses[0] else 'did not decrease'})")
groups = after.embed.groups
print(f"tables: {len(NAMES)} per-feature TFRA tables -> {len(groups)} fused group(s) {[g.feature_names for g in groups]}")
print(f"all-to-alls per step on N workers: {2 * len(NAMES)} per-feature -> {2 * len(groups)} fused")
