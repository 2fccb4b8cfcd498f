"""DLRM and DCN-v2 on FusedEmbedding and on PerFeatureEmbedding (in-process, one worker).

The tiny features of conftest (two dims, a multi-hot feature), batches from tf_fusedrec.data.synthetic_dataset:

* the two embedding layers start from equal Hashed rows, so the same model (same seeds) gives the same logits [B]
  on either, in training and inference calls;
* gradients reach every dense variable and the embedding tables;
* DLRM projects embeddings whose dim is not the interaction dim (bottom_mlp[-1]);
* num_dense=0 works for both models (the batch then has no "dense" key).
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec import config as cfg
from tf_fusedrec import data
from tf_fusedrec import models

RTOL, ATOL = 1e-5, 1e-6
MODELS = ["dlrm", "dcn"]
LAYERS = ["fused", "per_feature"]


def tiny(apps, num_dense=3, **features_kw):
    return cfg.parse_config(apps.tiny_config(data={"num_dense": num_dense}, **features_kw))


def batch_of(config, step=0):
    inputs = [data.SparseInput(f.name, f.vocab, f.zipf, tuple(f.hotness) if isinstance(f.hotness, list)
                               else f.hotness) for f in config.features]
    ds = data.synthetic_dataset(inputs, config.data.num_dense, 64, seed=0, start_step=step, steps=step + 1)
    return next(iter(ds))


_counter = iter(range(10**6))


def build(config, model_name, layer_kind, bottom_mlp=None):
    features = config.embedding_features()
    name = f"sparse_{layer_kind}_{next(_counter)}"
    if layer_kind == "fused":
        embedding = fr.FusedEmbedding(features, optimizer="adagrad", name=name)
    else:
        embedding = fr.PerFeatureEmbedding(features, optimizer="adagrad", name=name)
    m = config.model
    if model_name == "dlrm":
        return models.DLRM(embedding, bottom_mlp=bottom_mlp or m.bottom_mlp, top_mlp=m.top_mlp,
                           num_dense=config.data.num_dense)
    return models.DCNv2(embedding, cross_layers=m.cross_layers, deep_mlp=m.deep_mlp, num_dense=config.data.num_dense)


def test_batch_premises(apps):
    """What the other tests rely on: both dims, a ragged multi-hot feature with empty rows, dense features."""
    config = tiny(apps)
    features, labels = batch_of(config)
    assert sorted(features) == sorted(list(apps.TINY_FEATURES) + ["dense"])
    assert isinstance(features["B2"], tf.RaggedTensor)
    assert (features["B2"].row_lengths().numpy() == 0).any() and (features["B2"].row_lengths().numpy() > 1).any()
    assert features["dense"].shape == (64, 3) and labels.shape == (64,)
    assert {f.dim for f in config.features} == {4, 8} and config.model.bottom_mlp[-1] == 4


@pytest.mark.parametrize("model_name", MODELS)
def test_fused_and_per_feature_give_the_same_logits(apps, model_name):
    config = tiny(apps)
    features, _ = batch_of(config)
    fused = build(config, model_name, "fused")
    per_feature = build(config, model_name, "per_feature")
    for training in (False, True):
        got = fused(features, training=training)
        want = per_feature(features, training=training)
        assert got.shape == (64,) and want.shape == (64,), (got.shape, want.shape)
        assert np.isfinite(got.numpy()).all()
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=ATOL,
                                   err_msg=f"{model_name} logits (training={training}): fused vs per_feature")
    # not a degenerate model: the logits depend on the example
    assert np.std(got.numpy()) > 0
    # the same dense weights (seeded), so the only thing that could differ is the embedding layer
    dense_f, dense_p = dense_variables(fused), dense_variables(per_feature)
    assert [tuple(v.shape) for v in dense_f] == [tuple(v.shape) for v in dense_p] and dense_f
    for a, b in zip(dense_f, dense_p):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"{a.name} vs {b.name}")


def dense_variables(model):
    tables = {id(v) for v in model.embedding.embedding_variables()}
    return [v for v in model.trainable_variables if id(v) not in tables]


@pytest.mark.parametrize("layer_kind", LAYERS)
@pytest.mark.parametrize("model_name", MODELS)
def test_gradients_reach_dense_variables_and_tables(apps, model_name, layer_kind):
    config = tiny(apps)
    features, labels = batch_of(config)
    model = build(config, model_name, layer_kind)
    # A GroupedOptimizer claims the tables, so the tape hands it their rows' gradients (IndexedSlices); unclaimed,
    # native tables keep them until a plain optimizer's step and show the tape a zero.
    fr.train.make_optimizer(model)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(features, training=True))
    variables = model.trainable_variables
    grads = tape.gradient(loss, variables)
    tables = model.embedding.embedding_variables()
    assert tables and {id(v) for v in tables} <= {id(v) for v in variables}, \
        "the embedding tables are not among the model's trainable variables"
    expected_tables = 2 if layer_kind == "fused" else len(apps.TINY_FEATURES)
    assert len(tables) == expected_tables, [v.name for v in tables]
    dense = dense_variables(model)
    assert dense, "no dense variables"
    missing = [v.name for v, g in zip(variables, grads) if g is None]
    assert not missing, f"{model_name}/{layer_kind}: no gradient for {missing}"
    for v, g in zip(variables, grads):
        values = g.values if isinstance(g, tf.IndexedSlices) else g
        assert np.isfinite(values.numpy()).all(), v.name
    # the gradients are not all zero (the loss depends on the embeddings and on the dense weights)
    for group in (tables, dense):
        norms = [float(tf.norm(g.values if isinstance(g, tf.IndexedSlices) else g))
                 for v, g in zip(variables, grads) if any(v is w for w in group)]
        assert max(norms) > 0, norms


@pytest.mark.parametrize("layer_kind", LAYERS)
def test_dlrm_projects_other_dims(apps, layer_kind):
    config = tiny(apps)
    features, _ = batch_of(config)
    # interaction dim 4: the dim-8 features are projected to 4
    model = build(config, "dlrm", layer_kind)
    logits = model(features, training=True)
    assert logits.shape == (64,) and np.isfinite(logits.numpy()).all()
    assert sorted(model.projections) == ["8"]
    assert model.projections["8"].kernel.shape == (8, 4)
    # interaction dim 8: the dim-4 features are projected to 8
    model = build(config, "dlrm", layer_kind, bottom_mlp=(8, 8))
    logits = model(features, training=True)
    assert logits.shape == (64,) and np.isfinite(logits.numpy()).all()
    assert sorted(model.projections) == ["4"]
    assert model.projections["4"].kernel.shape == (4, 8)
    # 4 features + the bottom MLP's output: 5 vectors, 10 pairwise interactions, + the dense vector -> top MLP
    assert model.top.layers[0].kernel.shape[0] == 5 * 4 // 2 + 8


def test_dlrm_with_one_dim_has_no_projection(apps):
    config = tiny(apps, features=[{"name": "A{i}", "repeat": 3, "dim": 4}])
    features, _ = batch_of(config)
    model = build(config, "dlrm", "fused")
    assert model(features, training=True).shape == (64,)
    assert not model.projections


@pytest.mark.tfra
@pytest.mark.parametrize("model_name", MODELS)
def test_no_dense_features(apps, model_name):
    config = tiny(apps, num_dense=0)
    features, _ = batch_of(config)
    assert "dense" not in features
    fused = build(config, model_name, "fused")
    per_feature = build(config, model_name, "per_feature")
    got = fused(features, training=True)
    want = per_feature(features, training=True)
    assert got.shape == (64,) and np.isfinite(got.numpy()).all()
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=ATOL)
    if model_name == "dlrm":
        assert fused.bottom is None
        # 4 embedding vectors only: 6 pairwise interactions feed the top MLP
        assert fused.top.layers[0].kernel.shape[0] == 4 * 3 // 2
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(fused(features, training=True))
    grads = tape.gradient(loss, fused.trainable_variables)
    assert all(g is not None for g in grads), [v.name for v, g in zip(fused.trainable_variables, grads) if g is None]


def test_dlrm_interactions_equal_the_standard_ops(apps):
    """DLRM's pairwise interactions through ops.dot_interaction (training) and through the batch matmul and boolean
    mask (_blocks.standard_ops, what an export traces): the same logits and gradients to float32's rounding (the op
    sums each dot product in its own order), and not bit for bit only by that: the ops moved are the same."""
    from tf_fusedrec.models import _blocks  # noqa: PLC0415

    config = tiny(apps)
    model = build(config, "dlrm", "fused")
    features, labels = batch_of(config)

    def run(standard):
        with tf.GradientTape() as tape:
            if standard:
                with _blocks.standard_ops():
                    logits = model(features, training=True)
            else:
                logits = model(features, training=True)
            loss = tf.reduce_sum(logits * tf.cast(labels, tf.float32))
        dense = [v for v in model.trainable_variables if "sparse" not in v.name]
        return logits.numpy(), [g.numpy() for g in tape.gradient(loss, dense)]

    op_logits, op_grads = run(False)
    mask_logits, mask_grads = run(True)
    np.testing.assert_allclose(op_logits, mask_logits, rtol=1e-5, atol=1e-7)
    assert len(op_grads) == len(mask_grads) > 0
    for a, b in zip(op_grads, mask_grads):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * max(1.0, float(np.abs(b).max())))


def test_dlrm_interactions_upper_triangle_path_is_bit_equal_to_the_boolean_mask(apps):
    """The matmul path the float32 model leaves (other dtypes keep it): upper_pairs through ops.upper_triangle and
    through the boolean mask give the same values bit for bit."""
    from tf_fusedrec.models import _blocks  # noqa: PLC0415

    x = tf.constant(np.random.default_rng(2).normal(size=(16, 7, 5)).astype(np.float32))
    products = tf.matmul(x, x, transpose_b=True)
    with _blocks.standard_ops():
        masked = _blocks.upper_pairs(products).numpy()
    np.testing.assert_array_equal(_blocks.upper_pairs(products).numpy(), masked)
    np.testing.assert_allclose(_blocks.pairwise_dots(x).numpy(), masked, rtol=1e-5, atol=1e-6)


def test_pairwise_dots_of_the_vectors_equal_those_of_their_stack(apps):
    """_blocks.pairwise_dots of DLRM's F vectors (stacked feature-major for ops.dot_interaction) gives the values and
    per-vector gradients of the example-major stack's op bit for bit, and under standard_ops the boolean mask's."""
    from tf_fusedrec.models import _blocks  # noqa: PLC0415

    rng = np.random.default_rng(3)
    vectors = [tf.constant(rng.normal(size=(33, 16)).astype(np.float32)) for _ in range(27)]
    w = tf.constant(rng.normal(size=(33, 351)).astype(np.float32))

    def run(fn):
        with tf.GradientTape() as tape:
            tape.watch(vectors)
            y = fn()
            loss = tf.reduce_sum(y * w)
        return [y.numpy()] + [g.numpy() for g in tape.gradient(loss, vectors)]

    listed = run(lambda: _blocks.pairwise_dots(vectors))
    stacked = run(lambda: _blocks.pairwise_dots(tf.stack(vectors, axis=1)))
    for a, b in zip(listed, stacked):
        np.testing.assert_array_equal(a, b)
    with _blocks.standard_ops():
        masked = run(lambda: _blocks.pairwise_dots(vectors))
    for a, b in zip(listed, masked):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_dlrm_export_holds_tensorflow_ops_only(apps, tmp_path):
    """fr.export's dense SavedModel of a DLRM trained with tf_fusedrec's ops holds none of them: it loads where the
    op library is not (TensorFlow Serving), and predicts what the model predicts."""
    from tensorflow.core.protobuf import saved_model_pb2  # noqa: PLC0415

    config = tiny(apps)
    model = build(config, "dlrm", "fused")
    features, _ = batch_of(config)
    expected = model(features, training=False).numpy()
    fr.export.export_model(model, str(tmp_path / "export"), example=features)
    [pb] = list((tmp_path / "export").rglob("saved_model.pb"))
    saved = saved_model_pb2.SavedModel.FromString(pb.read_bytes())
    graph = saved.meta_graphs[0].graph_def
    op_types = {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
    assert "MatMul" in op_types or "BatchMatMulV2" in op_types, sorted(op_types)
    assert not [t for t in op_types if t.startswith("FusedRec")], sorted(op_types)
    served = fr.export.load_model(str(tmp_path / "export"))
    np.testing.assert_allclose(served.predict(features), expected, rtol=RTOL, atol=ATOL)
