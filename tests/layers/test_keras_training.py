"""FusedEmbedding trained as a Keras user trains it, under whichever Keras the process runs (Keras 3 in the current
lane, tf_keras in the baseline lane), against a plain-TensorFlow reference.

The reference model keeps one dense tf.Variable table per feature, starting from the layer's documented Hashed rows
(tests/layers/reference.py, written from the formula), and is trained by Keras' own SGD: with SGD a row that gets no
gradient does not move, so the dense reference and the sparse tables must agree to float32 rounding. Covered: the
layer's defaults (native tables) with a plain Keras optimizer in a custom loop and in model.fit (the update applied in
the backward pass), fr.train.make_optimizer in the same loop, eager and tf.function, a Keras optimizer instance as the
layer's optimizer, and the package never switching the process's Keras.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tests.layers import reference as ref

VOCAB, DIM, BATCH, STEPS, LR = 50, 4, 16, 4, 0.5
FEATURES = ("item", "user")


def _batches(seed=3):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        ids = {f: rng.integers(0, VOCAB, size=BATCH).astype(np.int64) for f in FEATURES}
        labels = rng.normal(size=(BATCH, 1)).astype(np.float32)
        out.append((ids, labels))
    return out


def _initial_tables():
    return {f: ref.hashed_rows(np.arange(VOCAB), ref.feature_salt(0, f), DIM) for f in FEATURES}


class TinyModel(tf.keras.Model):
    def __init__(self, embedding):
        super().__init__()
        self.embedding = embedding
        self.head = tf.keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros")

    def call(self, inputs, training=None):
        rows = self.embedding(inputs, training=training)
        return self.head(tf.concat([rows[f] for f in FEATURES], axis=1))


def _layer(**kwargs):
    features = [fr.Feature(f, dim=DIM) for f in FEATURES]
    kwargs.setdefault("optimizer", {"name": "sgd", "learning_rate": LR})
    return fr.FusedEmbedding(features, **kwargs)


def _reference(batches):
    """Per-feature dense tables + the same head, trained by Keras SGD: (tables, kernel, bias)."""
    tables = {f: tf.Variable(t) for f, t in _initial_tables().items()}
    kernel = tf.Variable(tf.ones([DIM * len(FEATURES), 1]))
    bias = tf.Variable(tf.zeros([1]))
    optimizer = tf.keras.optimizers.SGD(LR)
    variables = [tables[f] for f in FEATURES] + [kernel, bias]
    for ids, labels in batches:
        with tf.GradientTape() as tape:
            x = tf.concat([tf.gather(tables[f], ids[f]) for f in FEATURES], axis=1)
            loss = tf.reduce_mean(tf.square(tf.matmul(x, kernel) + bias - labels))
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip([tf.convert_to_tensor(g) for g in grads], variables))
    return {f: tables[f].numpy() for f in FEATURES}, kernel.numpy(), bias.numpy()


def _rows(layer, feature, ids):
    out = layer({f: tf.constant(ids, tf.int64) for f in FEATURES}, training=False)
    return out[feature].numpy()


def _check(model, batches):
    tables, kernel, bias = _reference(batches)
    np.testing.assert_allclose(model.head.kernel.numpy(), kernel, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(model.head.bias.numpy(), bias, rtol=2e-5, atol=2e-6)
    for f in FEATURES:
        np.testing.assert_allclose(_rows(model.embedding, f, np.arange(VOCAB)), tables[f], rtol=2e-5, atol=2e-6)


def _loss(model, ids, labels):
    return tf.reduce_mean(tf.square(model(ids, training=True) - labels))


def _train_in_a_custom_loop(model, optimizer, batches, mode):
    """One optimizer step per batch, eagerly or in a tf.function ("function")."""
    def step(ids, labels):
        with tf.GradientTape() as tape:
            loss = _loss(model, ids, labels)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    if mode == "function":
        step = tf.function(step)
    for ids, labels in batches:
        step(ids, labels)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_plain_keras_optimizer_trains_the_default_layer(mode):
    """The drop-in path: the layer's defaults and a plain Keras optimizer in a custom loop."""
    batches = _batches()
    model = TinyModel(_layer(name=f"plain_{mode}"))
    _train_in_a_custom_loop(model, tf.keras.optimizers.SGD(LR), batches, mode)
    assert model.embedding.table_backend == "native"
    _check(model, batches)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_make_optimizer_trains_like_the_reference(mode):
    batches = _batches()
    model = TinyModel(_layer(name=f"grouped_{mode}"))
    model(batches[0][0])
    _train_in_a_custom_loop(model, fr.train.make_optimizer(model, default=tf.keras.optimizers.SGD(LR)), batches, mode)
    _check(model, batches)


@pytest.mark.parametrize("grouped", [False, True], ids=["plain_optimizer", "make_optimizer"])
def test_model_fit_trains_like_the_reference(grouped):
    batches = _batches()
    model = TinyModel(_layer(name=f"fit_{int(grouped)}"))
    model(batches[0][0])
    optimizer = fr.train.make_optimizer(model, default=tf.keras.optimizers.SGD(LR)) if grouped else (
        tf.keras.optimizers.SGD(LR))
    model.compile(optimizer=optimizer, loss="mse")

    def gen():
        yield from batches

    spec = ({f: tf.TensorSpec([BATCH], tf.int64) for f in FEATURES}, tf.TensorSpec([BATCH, 1], tf.float32))
    model.fit(tf.data.Dataset.from_generator(gen, output_signature=spec), epochs=1, verbose=0, shuffle=False)
    _check(model, batches)


def test_keras_optimizer_instance_as_the_layers_optimizer():
    """FusedEmbedding(optimizer=<a Keras optimizer>): its class and hyperparameters become the groups' spec."""
    layer = _layer(optimizer=tf.keras.optimizers.SGD(LR), name="instance")
    spec = layer.groups[0].spec.optimizer
    assert spec.name == "sgd" and dict(spec.config)["learning_rate"] == pytest.approx(LR)
    with pytest.raises(ValueError, match="clipnorm"):
        _layer(optimizer=tf.keras.optimizers.SGD(LR, clipnorm=1.0), name="clipped")


def test_plain_optimizer_refuses_what_needs_make_optimizer():
    """Eviction needs the GroupedOptimizer's after-update hook: a plain optimizer's step says so, naming the layer."""
    model = TinyModel(_layer(name="evicting", eviction=fr.Eviction(capacity=10_000)))
    ids, labels = _batches()[0]
    with tf.GradientTape() as tape:
        loss = _loss(model, ids, labels)
    grads = tape.gradient(loss, model.trainable_variables)
    with pytest.raises(ValueError, match="evicting: eviction needs fr.train.make_optimizer"):
        tf.keras.optimizers.SGD(LR).apply_gradients(zip(grads, model.trainable_variables))


def test_a_computed_gradient_changes_nothing_until_the_optimizer_steps():
    """The tables move when the optimizer applies a step, not when a gradient is computed: two gradients computed
    from one state are equal, and the rows are the initial ones until apply_gradients."""
    model = TinyModel(_layer(name="inspect"))
    ids, labels = _batches()[0]
    grads = []
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = _loss(model, ids, labels)
        grads.append(tape.gradient(loss, model.trainable_variables))
    for a, b in zip(*grads):
        np.testing.assert_array_equal(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy())
    np.testing.assert_array_equal(_rows(model.embedding, "user", np.arange(VOCAB)), _initial_tables()["user"])
    tf.keras.optimizers.SGD(LR).apply_gradients(zip(grads[1], model.trainable_variables))
    assert not np.array_equal(_rows(model.embedding, "user", np.arange(VOCAB)), _initial_tables()["user"])


def test_the_package_never_switches_keras():
    """tf.keras is what the process chose before tf_fusedrec was imported (conftest: Keras 2 only where TFRA is)."""
    import os  # noqa: PLC0415

    legacy = os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True")
    assert tf.keras.layers.Layer.__module__.startswith("tf_keras") == legacy
    assert isinstance(_layer(name="which_keras"), tf.keras.layers.Layer)
