"""fr.PerFeatureEmbedding (the TFRA baseline, one HvdAllToAllEmbedding per feature): the same inputs, outputs,
initial rows and updates as FusedEmbedding and the NumPy reference."""

import json

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tests.layers import reference as ref
from tests.layers.test_fused_embedding import (  # noqa: F401  (fixtures)
    UNUSUAL_NAMES,
    check_outputs,
    inputs_of,
    key_dtype,
    mixed_batch,
    mixed_features,
    mode,
    names,
    upstream_weights,
    weighted_loss,
)

pytestmark = pytest.mark.tfra  # PerFeatureEmbedding is TFRA's layer, one per feature


def table_sizes(layer):
    return {n: int(layer.tfra_layer(n).params.size()) for n in sorted(f.name for f in layer.features)}


def test_outputs_equal_reference_and_fused(mode, key_dtype):
    features = mixed_features(key_dtype)
    batch = mixed_batch()
    layer = fr.PerFeatureEmbedding(features)
    out = ref.call_layer(layer, inputs_of(features, batch), mode)
    check_outputs(out, features, batch)
    fused = ref.call_layer(fr.FusedEmbedding(features), inputs_of(features, batch), mode)
    for f in features:
        ref.assert_close(ref.to_numpy(out[f.name]), ref.to_numpy(fused[f.name]), f.name)
    # One table per feature, keyed by the raw id, one row per unique id.
    assert table_sizes(layer) == {f.name: ref.id_counts(batch[f.name])[1] for f in features}
    keys = np.sort(layer.tfra_layer("hist").params.export()[0].numpy())
    np.testing.assert_array_equal(keys, np.unique(ref.valid_ids(batch["hist"])))


def test_groups_one_per_feature():
    features = mixed_features()
    layer = fr.PerFeatureEmbedding(features)
    groups = layer.groups
    assert [g.feature_names for g in groups] == [(n,) for n in sorted(f.name for f in features)]
    assert [g.index for g in groups] == list(range(len(features)))
    assert {g.feature_names[0]: g.spec.dim for g in groups} == {f.name: f.dim for f in features}


def test_empty_batch(mode):
    features = [fr.Feature("one", 4), fr.Feature("dense", 4), fr.Feature("rag", 2, combiner="mean")]
    layer = fr.PerFeatureEmbedding(features)
    batch = {"one": np.zeros([0], np.int64), "dense": np.zeros([0, 3], np.int64), "rag": []}
    out = ref.call_layer(layer, inputs_of(features, batch), mode)
    check_outputs(out, features, batch)
    assert set(table_sizes(layer).values()) == {0}


def test_training_false_inserts_nothing(mode):
    features = mixed_features(tf.int32)
    batch = mixed_batch()
    layer = fr.PerFeatureEmbedding(features)
    out = ref.call_layer(layer, inputs_of(features, batch), mode, training=False)
    check_outputs(out, features, batch)
    assert set(table_sizes(layer).values()) == {0}


def test_errors_name_the_feature(mode):
    features = [fr.Feature("aa", 4), fr.Feature("bb", 2, combiner="sum", key_dtype=tf.int32)]
    layer = fr.PerFeatureEmbedding(features)
    good = {"aa": np.array([1, 2]), "bb": np.array([[3, -1], [4, 5]])}
    check_outputs(ref.call_layer(layer, inputs_of(features, good), "eager"), features, good)
    sizes = table_sizes(layer)
    with pytest.raises(ValueError, match=names("bb")):
        ref.call_layer(layer, {"aa": tf.constant([1], tf.int64)}, mode)
    with pytest.raises((TypeError, ValueError), match=names("bb")):
        ref.call_layer(layer, {"aa": tf.constant([1], tf.int64), "bb": tf.constant([1], tf.int64)}, mode)
    bad = {"aa": np.array([7, 8]), "bb": np.array([[9, -3], [4, 5]])}
    with pytest.raises(tf.errors.InvalidArgumentError, match=names("bb")):
        out = ref.call_layer(layer, inputs_of(features, bad), mode)
        [ref.to_numpy(v) for v in out.values()]
    assert table_sizes(layer) == sizes
    with pytest.raises(ValueError, match=names("dup")):
        fr.PerFeatureEmbedding([fr.Feature("dup", 2), fr.Feature("dup", 2)])


def test_sgd_update_equals_fused(mode):
    lr = 0.5
    features = mixed_features()
    batch = mixed_batch()
    weights = upstream_weights(features, batch, seed=1)
    layers = [fr.PerFeatureEmbedding(features, optimizer={"name": "sgd", "learning_rate": lr}),
              fr.FusedEmbedding(features, optimizer={"name": "sgd", "learning_rate": lr})]
    inputs = inputs_of(features, batch)
    for layer in layers:
        optimizer = fr.train.make_optimizer(layer, default="sgd")

        def step(x, layer=layer, optimizer=optimizer):
            with tf.GradientTape() as tape:
                loss = weighted_loss(layer(x, training=True), weights)
            variables = layer.trainable_variables
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

        (tf.function(step) if mode == "function" else step)(inputs)
    per_feature, fused = layers
    for f in features:
        grads = ref.row_gradients(batch[f.name], weights[f.name], f.combiner, f.dim)
        ids = sorted(grads)
        values, exists = per_feature.tfra_layer(f.name).params.lookup(tf.constant(ids, tf.int64), return_exists=True)
        assert exists.numpy().all(), f.name
        want = ref.initial_rows(f.name, ids, f.dim) - lr * np.stack([grads[i] for i in ids])
        np.testing.assert_allclose(values.numpy(), want, atol=2e-6, rtol=1e-5, err_msg=f.name)
    # Then both layers give the same outputs again.
    a = ref.call_layer(per_feature, inputs, "eager", training=False)
    b = ref.call_layer(fused, inputs, "eager", training=False)
    for f in features:
        ref.assert_close(ref.to_numpy(a[f.name]), ref.to_numpy(b[f.name]), f.name)


def test_get_config_round_trip():
    features = [fr.Feature("u", 4, key_dtype=tf.int32), fr.Feature("v", 3, combiner="mean", optimizer="sgd")]
    layer = fr.PerFeatureEmbedding(features, optimizer={"name": "adagrad", "learning_rate": 0.2},
                                   initializer=fr.initializers.Hashed(seed=4, stddev=0.1))
    clone = fr.PerFeatureEmbedding.from_config(json.loads(json.dumps(layer.get_config())))
    assert clone.get_config() == layer.get_config()
    assert [(g.feature_names, g.spec) for g in clone.groups] == [(g.feature_names, g.spec) for g in layer.groups]
    batch = {"u": np.array([1, 5]), "v": [[2, 3], []]}
    rows_fn = ref.hashed_initial(seed=4, stddev=0.1)
    for l in (layer, clone):
        check_outputs(ref.call_layer(l, inputs_of(features, batch), "eager"), features, batch, rows_fn)


def test_unusual_feature_names(mode):
    # The same features FusedEmbedding accepts (test_fused_embedding.py::test_unusual_feature_names).
    features = [fr.Feature(n, 2, combiner="sum" if i % 2 else None) for i, n in enumerate(UNUSUAL_NAMES)]
    batch = {n: np.array([[1, 2], [3, -1]]) for n in UNUSUAL_NAMES}
    layer = fr.PerFeatureEmbedding(features)
    check_outputs(ref.call_layer(layer, inputs_of(features, batch), mode), features, batch)


def test_extreme_ids(mode, key_dtype):
    top = 2**63 - 1 if key_dtype == tf.int64 else 2**31 - 1
    features = [fr.Feature("x", 4, key_dtype=key_dtype), fr.Feature("y", 4, combiner="sum", key_dtype=key_dtype)]
    batch = {"x": np.array([0, top, top - 1]), "y": [[top, 0], []]}
    layer = fr.PerFeatureEmbedding(features)
    check_outputs(ref.call_layer(layer, inputs_of(features, batch), mode), features, batch)
    assert table_sizes(layer) == {"x": 3, "y": 2}
