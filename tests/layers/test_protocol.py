"""The embedding-layer protocol (tf_fusedrec/layers/protocol.py): the layers are EmbeddingLayers, the optional
methods have the defaults of a layer without the feature, a missing required method fails naming the layer, and
fr.train finds embedding layers by the protocol, not by the names of their methods."""

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec.bench.strawman import HandFusedTFRAEmbedding
from tf_fusedrec.layers.protocol import EmbeddingLayer
from tf_fusedrec.train.optimizer import embedding_layers

FEATURES = [fr.Feature("a", 4), fr.Feature("b", 4)]


@pytest.mark.parametrize("make", [
    lambda: fr.FusedEmbedding(FEATURES, name="fused"),
    lambda: fr.PerFeatureEmbedding(FEATURES, name="per_feature"),
    lambda: HandFusedTFRAEmbedding(FEATURES, name="hand_fused"),
], ids=["fused", "per_feature", "hand_fused"])
def test_the_layers_are_embedding_layers(make):
    layer = make()
    assert isinstance(layer, EmbeddingLayer)
    assert embedding_layers(tf.keras.Sequential([layer])) == [layer]
    assert len(layer.optimizer_groups()) >= 1


@pytest.mark.tfra
def test_defaults_of_a_layer_without_the_optional_features():
    layer = fr.PerFeatureEmbedding(FEATURES, name="plain")
    assert layer.replicated_tables() == [] and layer.replicated_variables() == []
    assert layer.after_update(None) is None and layer.statistics() == {}
    assert layer.access_tables() == [None, None] == [None] * len(layer.sharded_tables())


def test_a_missing_required_method_names_the_layer():
    class Incomplete(EmbeddingLayer):
        pass

    layer = Incomplete()
    for method in ("optimizer_groups", "native_tables", "sharded_tables"):
        with pytest.raises(NotImplementedError, match=f"Incomplete.{method}"):
            getattr(layer, method)()


def test_a_layer_with_the_method_names_but_not_the_protocol_is_not_an_embedding_layer():
    class LooksLikeOne(tf.keras.layers.Layer):
        comm = None

        def optimizer_groups(self):
            return []

    assert embedding_layers([LooksLikeOne()]) == []
    with pytest.raises(ValueError, match="no FusedEmbedding or PerFeatureEmbedding layer"):
        fr.train.make_optimizer([LooksLikeOne()])


# --------------------------------------------------------------------------------------------------------------
# AutoGraph leaves the library's layers and models alone (protocol.unconverted)
# --------------------------------------------------------------------------------------------------------------

def _converted_modules(monkeypatch, run):
    """The modules of the functions AutoGraph transforms (cached or not: every conversion passes here) while
    `run()` traces."""
    from tensorflow.python.autograph.pyct import transpiler  # noqa: PLC0415

    modules = []
    transform = transpiler.PyToPy.transform_function

    def recording(self, fn, *args, **kwargs):
        modules.append(getattr(fn, "__module__", None) or "?")
        return transform(self, fn, *args, **kwargs)

    monkeypatch.setattr(transpiler.PyToPy, "transform_function", recording)
    run()
    return modules


def _dlrm(layer_cls, optimizer):
    features = [fr.Feature("a", 4), fr.Feature("b", 4, combiner="mean"), fr.Feature("c", 8)]
    model = fr.models.DLRM(layer_cls(features, optimizer=optimizer, name=f"ag_{layer_cls.__name__}"),
                           bottom_mlp=(8, 4), top_mlp=(6,), num_dense=2, seed=1)
    inputs = {"a": tf.constant([1, 2, 3], tf.int64), "b": tf.ragged.constant([[1, 4], [], [7]], tf.int64),
              "c": tf.constant([5, 6, 7], tf.int64), "dense": tf.ones([3, 2])}
    return model, inputs


def _grm():
    features = [fr.Feature("items", 8), fr.Feature("target", 8, shares="items"), fr.Feature("device", 4)]
    model = fr.models.GRM(fr.FusedEmbedding(features, name="ag_grm"), sequence_feature="items", num_blocks=1,
                          experts=2, expert_units=(4,), tower_units=(3,), seed=2)
    inputs = {"items": tf.ragged.constant([[1, 2, 3], [], [4]], tf.int64), "target": tf.constant([3, 1, 4], tf.int64),
              "device": tf.constant([0, 1, 2], tf.int64)}
    return model, inputs


@pytest.mark.parametrize("make", [
    lambda: _dlrm(fr.FusedEmbedding, {"name": "adagrad", "learning_rate": 0.1}),
    lambda: _dlrm(fr.PerFeatureEmbedding, {"name": "sgd", "learning_rate": 0.1}),
    _grm,
], ids=["dlrm_fused", "dlrm_per_feature", "grm"])
def test_autograph_converts_none_of_the_librarys_layers(monkeypatch, make):
    """A user's tf.function (AutoGraph on, the default) around a model of the library's layers: AutoGraph converts
    none of tf_fusedrec's code (before: every layer's call and what it calls, with tf_keras' layer machinery, seconds
    of CPU per process), and the function computes what the eager call does, training or not, with gradients."""
    model, inputs = make()
    eager = model(inputs, training=False)

    @tf.function
    def user_step(x):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(tf.square(logits))
        grads = tape.gradient(loss, model.trainable_variables)
        return loss, grads

    predict = tf.function(lambda x: model(x, training=False))
    traced = {}
    modules = _converted_modules(monkeypatch, lambda: traced.update(
        predicted=predict(inputs), step=user_step(inputs)))
    ours = sorted({m for m in modules if m.startswith("tf_fusedrec")})
    assert ours == [], f"AutoGraph converted the library's code in {ours}"
    assert modules, "the recorder saw no conversion at all (the user's own functions are converted)"
    np.testing.assert_allclose(traced["predicted"].numpy(), eager.numpy(), rtol=1e-6, atol=1e-6)
    with tf.GradientTape() as tape:
        want_loss = tf.reduce_mean(tf.square(model(inputs, training=True)))
    want = tape.gradient(want_loss, model.trainable_variables)
    loss, grads = traced["step"]
    np.testing.assert_allclose(loss.numpy(), want_loss.numpy(), rtol=1e-6)
    for g, w in zip(grads, want):
        np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(), tf.convert_to_tensor(w).numpy(), rtol=1e-5,
                                   atol=1e-6)
