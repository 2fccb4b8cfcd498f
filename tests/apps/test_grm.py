"""The GRM (tf_fusedrec/models/grm.py) and its config (configs/grm_synthetic.yaml), in one process.

* the forward pass on a small ragged batch (an empty row included) equals a NumPy reference written from the
  equations (one sequence at a time, explicit [L, L] causal masks), eagerly and in a tf.function, for two settings
  (causal normaliser, position bias, last-item pooling, 2 heads; a fixed normaliser, no bias, mean pooling, 1 head);
* causal_pairs lists exactly the pairs j <= i of each sequence (sum L (L + 1) / 2 of them) with the log buckets;
* causality: changing an item changes no earlier state of its sequence and nothing in the other sequences;
* padding-free: one long sequence among many short ones gives each sequence what it gets alone;
* gradients reach the tables and every dense weight, and a few training steps on FusedEmbedding lower the loss;
* configs/grm_synthetic.yaml parses and builds the model and the dataset; bad fields are errors naming them.
"""

import numpy as np
import pytest

import tf_fusedrec as fr
import tensorflow as tf

from tf_fusedrec import config as cfg
from tf_fusedrec import models
from tf_fusedrec.models import grm as grm_lib
from tf_fusedrec.train import experiment

CONFIG = "configs/grm_synthetic.yaml"
ITEM_DIM = 8
SETTINGS = {
    "causal_bias_last": dict(num_heads=2, hidden_dim=8, position_buckets=4, attention_norm="causal", pooling="last"),
    "fixed_nobias_mean": dict(num_heads=1, hidden_dim=6, position_buckets=0, attention_norm=7, pooling="mean"),
}
_names = iter(range(10**6))


def make_embedding(kind="fused"):
    features = [fr.Feature("items", ITEM_DIM), fr.Feature("target", ITEM_DIM), fr.Feature("device", 4)]
    name = f"grm_sparse_{kind}_{next(_names)}"
    layer = fr.FusedEmbedding if kind == "fused" else fr.PerFeatureEmbedding
    return layer(features, optimizer={"name": "adagrad", "learning_rate": 0.1}, name=name)


def make_model(kind="fused", seed=3, **overrides):
    kwargs = dict(num_blocks=2, experts=3, expert_units=(8, 6), tower_units=(5,), seed=seed)
    kwargs.update(SETTINGS["causal_bias_last"])
    kwargs.update(overrides)
    model = models.GRM(make_embedding(kind), sequence_feature="items", **kwargs)
    return model


def batch(lengths, seed=0):
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, np.int64)
    items = rng.integers(0, 50, size=int(lengths.sum()), dtype=np.int64)
    return {
        "items": tf.RaggedTensor.from_row_lengths(items, lengths),
        "target": tf.constant(rng.integers(0, 50, size=lengths.size, dtype=np.int64)),
        "device": tf.constant(rng.integers(0, 4, size=lengths.size, dtype=np.int64)),
    }


def randomize_position_bias(model, seed=1):
    """The bias starts at zero; random values make the reference check its indexing."""
    rng = np.random.default_rng(seed)
    for block in model.blocks:
        if block.position_bias is not None:
            block.position_bias.assign(rng.normal(0, 0.5, block.position_bias.shape).astype(np.float32))


# ----------------------------------------------------------------------------------------------------------------
# The NumPy reference: one sequence at a time, dense [L, L] masks, float64
# ----------------------------------------------------------------------------------------------------------------

def silu(x):
    return x / (1.0 + np.exp(-x))


def layer_norm(x, layer):
    gamma, beta = (w.numpy().astype(np.float64) for w in (layer.gamma, layer.beta))
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + layer.epsilon) * gamma + beta


def dense(x, layer, activation=None):
    y = x @ layer.kernel.numpy().astype(np.float64) + layer.bias.numpy().astype(np.float64)
    if activation == "relu":
        return np.maximum(y, 0.0)
    if activation == "softmax":
        e = np.exp(y - y.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    return y


def reference_block(x, block, attention_norm):
    """x: [L, d] of one sequence."""
    length = x.shape[0]
    heads, hidden = block.num_heads, block.hidden_dim
    head_dim = hidden // heads
    u, q, k, v = np.split(silu(dense(layer_norm(x, block.input_norm), block.uqkv)), 4, axis=1)
    causal = np.tril(np.ones((length, length)))
    if attention_norm == "causal":
        n = np.arange(1, length + 1, dtype=np.float64)[:, None]
    else:
        n = float(attention_norm)
    out = np.zeros((length, hidden))
    for h in range(heads):
        cols = slice(h * head_dim, (h + 1) * head_dim)
        scores = q[:, cols] @ k[:, cols].T
        if block.position_bias is not None:
            bias = block.position_bias.numpy().astype(np.float64)
            buckets = block.position_bias.shape[0]
            for i in range(length):
                for j in range(i + 1):
                    scores[i, j] += bias[min((i - j + 1).bit_length() - 1, buckets - 1), h]
        out[:, cols] = (silu(scores) * causal / n) @ v[:, cols]
    return x + dense(layer_norm(out, block.attention_norm) * u, block.output_projection)


def reference_states(model, items):
    """items: [L, d] float64 -> the last block's states [L, d]."""
    x = items
    for block in model.blocks:
        x = reference_block(x, block, model.attention_norm)
    return x


def reference_mmoe(head, h):
    experts = []
    for expert in head.experts:
        e = h
        for layer in expert.layers:
            e = dense(e, layer, "relu")
        experts.append(e)
    experts = np.stack(experts, axis=1)  # [B, E, u]
    logits = []
    for gate, tower in zip(head.gates, head.towers):
        g = dense(h, gate, "softmax")
        t = np.einsum("be,beu->bu", g, experts)
        for i, layer in enumerate(tower.layers):
            t = dense(t, layer, "relu" if i < len(tower.layers) - 1 else None)
        logits.append(t[:, 0])
    return np.stack(logits, axis=1)


def reference_forward(model, features):
    """Logits [B, tasks] and the per-sequence states, from the embedding layer's rows."""
    embedded = model.embedding(features, training=False)
    rows = [r.astype(np.float64) for r in embedded["items"].numpy()]  # ragged -> list of [L, d]
    states = [reference_states(model, r) if r.shape[0] else np.zeros((0, ITEM_DIM)) for r in rows]
    if model.pooling == "last":
        pooled = [s[-1] if s.shape[0] else np.zeros(ITEM_DIM) for s in states]
    else:
        pooled = [s.mean(axis=0) if s.shape[0] else np.zeros(ITEM_DIM) for s in states]
    h = np.concatenate([np.stack(pooled)] + [embedded[n].numpy().astype(np.float64)
                                             for n in model.context_features], axis=1)
    return reference_mmoe(model.head, h), states


# ----------------------------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------------------------

def test_causal_pairs_are_exactly_the_causal_pairs_of_each_sequence():
    lengths = [3, 0, 1, 6, 2]
    splits = np.concatenate([[0], np.cumsum(lengths)])
    pairs = grm_lib.causal_pairs(tf.constant(splits, tf.int64), position_buckets=3, attention_norm="causal")
    want = []
    for b, length in enumerate(lengths):
        for i in range(length):
            for j in range(i + 1):
                want.append((splits[b] + i, splits[b] + j, min((i - j + 1).bit_length() - 1, 2), i + 1))
    got = list(zip(pairs.query.numpy(), pairs.key.numpy(), pairs.bucket.numpy(), pairs.normalizer.numpy()))
    assert len(got) == sum(n * (n + 1) // 2 for n in lengths) == len(want)
    assert sorted(got) == sorted(want)
    fixed = grm_lib.causal_pairs(tf.constant(splits, tf.int64), position_buckets=0, attention_norm=5)
    assert set(fixed.bucket.numpy()) == {0} and set(fixed.normalizer.numpy()) == {5.0}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_forward_equals_numpy_reference(setting, mode):
    model = make_model(**SETTINGS[setting])
    features = batch([3, 0, 1, 7, 2, 4])
    model(features, training=False)  # builds the weights
    randomize_position_bias(model)
    call = model if mode == "eager" else tf.function(lambda f: model(f, training=False), reduce_retracing=True)
    got = call(features).numpy()
    want, states = reference_forward(model, features)
    assert got.shape == (6, 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{setting}/{mode}: logits")
    got_states = model.sequence_states(features, training=False)
    for b, s in enumerate(states):
        np.testing.assert_allclose(got_states[b].numpy(), s, rtol=1e-5, atol=1e-5, err_msg=f"row {b} states")
    assert np.std(got[:, 0]) > 0 and np.std(got[:, 1]) > 0, "logits do not depend on the example"


def test_changing_an_item_changes_no_earlier_state():
    model = make_model()
    features = batch([5, 9, 4])
    model(features)
    randomize_position_bias(model)
    before = model.sequence_states(features)
    items = features["items"].to_list()
    changed_at = 6
    items[1][changed_at] = 49 if items[1][changed_at] != 49 else 48
    changed = dict(features, items=tf.ragged.constant(items, dtype=tf.int64))
    after = model.sequence_states(changed)
    np.testing.assert_array_equal(after[1][:changed_at].numpy(), before[1][:changed_at].numpy(),
                                  err_msg="a state before the changed item moved")
    for b in (0, 2):
        np.testing.assert_array_equal(after[b].numpy(), before[b].numpy(), err_msg=f"sequence {b} moved")
    moved = np.abs(after[1][changed_at:].numpy() - before[1][changed_at:].numpy()).max(axis=1)
    assert (moved > 1e-6).all(), f"the changed item and the later ones must move: {moved}"


def test_long_and_short_sequences_together_equal_each_alone():
    model = make_model(position_buckets=8)
    lengths = [2, 1, 300, 3, 0, 5, 1, 4]
    features = batch(lengths, seed=7)
    together_logits = model(features).numpy()
    together = model.sequence_states(features)
    for b in range(len(lengths)):
        alone = {k: v[b:b + 1] for k, v in features.items()}
        np.testing.assert_allclose(model(alone).numpy()[0], together_logits[b], rtol=1e-5, atol=1e-6,
                                   err_msg=f"sequence {b} (length {lengths[b]}): logits")
        np.testing.assert_allclose(model.sequence_states(alone)[0].numpy(), together[b].numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=f"sequence {b}: states")
    # no [B, Lmax, Lmax] padding: the attention pairs are those of the sequences
    pairs = grm_lib.causal_pairs(features["items"].row_splits)
    assert pairs.query.shape[0] == sum(n * (n + 1) // 2 for n in lengths) < len(lengths) * 300 * 301 // 2 // 5


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fused", "per_feature"])
def test_gradients_reach_tables_and_every_dense_weight(kind):
    model = make_model(kind)
    fr.train.make_optimizer(model)  # claims the tables: the tape hands their rows' gradients to it (test_models.py)
    features = batch([4, 0, 6, 2, 3], seed=2)
    labels = tf.constant([[1, 1], [0, 0], [1, 0], [0, 0], [1, 0]], tf.float32)
    with tf.GradientTape() as tape:
        loss = tf.keras.losses.BinaryCrossentropy(from_logits=True)(labels, model(features, training=True))
    variables = model.trainable_variables
    grads = tape.gradient(loss, variables)
    tables = {id(v) for v in model.embedding.embedding_variables()}
    assert tables and tables <= {id(v) for v in variables}
    dense_names = {getattr(v, "path", v.name) for v in variables if id(v) not in tables}  # Keras 3: the path
    for part in ("input_norm", "uqkv", "position_bias", "attention_norm", "output", "expert_", "gate_", "tower_"):
        assert any(part in n for n in dense_names), f"no dense variable named like {part!r}: {sorted(dense_names)}"
    for v, g in zip(variables, grads):
        assert g is not None, f"no gradient for {v.name}"
        values = (g.values if isinstance(g, tf.IndexedSlices) else g).numpy()
        assert np.isfinite(values).all(), v.name
        assert np.abs(values).max() > 0, f"zero gradient for {v.name}"


def test_training_steps_lower_the_loss_on_a_fixed_batch():
    model = make_model("fused")
    features = batch([6, 3, 0, 9, 4, 2, 7, 5], seed=4)
    labels = tf.constant([[1, 1], [0, 0], [1, 0], [0, 0], [1, 1], [0, 0], [1, 0], [0, 0]], tf.float32)
    optimizer = fr.train.make_optimizer(model, default={"name": "adam", "learning_rate": 0.01})
    loss_fn = experiment.binary_cross_entropy()
    losses = []
    for _ in range(8):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        losses.append(float(loss))
    assert losses[-1] < 0.9 * losses[0], f"the loss did not fall: {losses}"
    # the tables learned too: the rows of the batch's items moved away from their initial (hashed) values
    fresh = make_model("fused").embedding(features, training=False)["items"].flat_values.numpy()
    trained = model.embedding(features, training=False)["items"].flat_values.numpy()
    assert np.abs(trained - fresh).max() > 1e-3, "the item rows did not change"


# ----------------------------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------------------------

def test_config_builds_the_model_and_the_dataset(apps):
    config = cfg.load_config(apps.ROOT / CONFIG)
    assert config.model.name == "grm" and config.data.source == "grm_synthetic"
    seq = config.data.sequences
    assert isinstance(seq, cfg.SequenceConfig)
    assert (seq.feature, seq.target, seq.max_length, seq.truncate) == ("items", "target", 2048, False)
    assert seq.longest_length == 50 * seq.median_length
    assert config.model.expert_units == (64, 32) and config.model.tower_units == (16,)
    embedding = experiment.make_embedding("fused", config.embedding_features(), config, name="grm_cfg_sparse")
    model = experiment.make_model(config, embedding)
    assert isinstance(model, models.GRM)
    assert len(model.blocks) == config.model.num_blocks and model.blocks[0].num_heads == config.model.num_heads
    assert model.context_features == ["device", "target", "user_segment"]
    features, labels = next(iter(experiment.make_dataset(config, 16, rank=0, size=1)))
    assert isinstance(features["items"], tf.RaggedTensor) and labels.shape == (16, 2)
    logits = model(features, training=False)
    assert logits.shape == (16, 2) and np.isfinite(logits.numpy()).all()
    assert models.build_model("grm", make_embedding(), sequence_feature="items").tasks == ("click", "conversion")


def _raw(apps):
    import yaml  # noqa: PLC0415

    return yaml.safe_load((apps.ROOT / CONFIG).read_text())


@pytest.mark.parametrize("section, key, value, fragment", [
    ("model", "hidden_dim", 31, "model.hidden_dim: must be a multiple of num_heads"),
    ("model", "num_blocks", 0, "model.num_blocks: must be a positive int"),
    ("model", "attention_norm", "length", "model.attention_norm"),
    ("model", "pooling", "max", "model.pooling"),
    ("model", "expert_units", [], "model.expert_units"),
    ("model", "position_buckets", -1, "model.position_buckets"),
    ("model", "experts_count", 3, "unknown key 'experts_count'"),
    ("sequences", "max_length", 0, "data.sequences: max_length must be an int >= 1"),
    ("sequences", "median_length", 0.5, "data.sequences: median_length"),
    ("sequences", "empty_fraction", 1.0, "data.sequences: empty_fraction"),
    ("sequences", "feature", "history", "data.sequences: feature: the sequence feature 'history'"),
    ("sequences", "target", "device", "data.sequences: target: feature 'device' has vocab 16"),
    ("sequences", "cap", 10, "data.sequences: unknown key 'cap'"),
    ("data", "num_dense", 13, "data.num_dense"),
])
def test_config_errors_name_the_field(apps, section, key, value, fragment):
    raw = _raw(apps)
    target = raw["data"]["sequences"] if section == "sequences" else raw[section]
    target[key] = value
    with pytest.raises(ValueError) as e:
        cfg.parse_config(raw, where="grm.yaml")
    assert fragment in str(e.value), str(e.value)


def test_config_errors_on_mismatched_model_source_and_combiner(apps):
    raw = _raw(apps)
    raw["model"] = {"name": "dcn"}
    with pytest.raises(ValueError, match=r"grm.yaml.model.name: 'dcn' does not fit data.source 'grm_synthetic'"):
        cfg.parse_config(raw, where="grm.yaml")
    raw["model"] = {"name": "dlrm"}  # the baseline: it pools the history, which must say how
    with pytest.raises(ValueError, match=r"features \(items\): the DLRM pools the sequence feature, give it combiner "
                                         r"sum or mean, got None"):
        cfg.parse_config(raw, where="grm.yaml")
    raw = apps.tiny_config("grm")
    with pytest.raises(ValueError, match=r"model.name: 'grm' does not fit data.source 'synthetic'"):
        cfg.parse_config(raw, where="tiny.yaml")
    raw = apps.tiny_config(data={"sequences": {"feature": "A1"}})
    with pytest.raises(ValueError, match=r"tiny.yaml.data.sequences: only for the sequence sources"):
        cfg.parse_config(raw, where="tiny.yaml")
    raw = _raw(apps)
    raw["features"][0]["combiner"] = "mean"
    with pytest.raises(ValueError, match=r"features \(items\): the sequence feature needs combiner null"):
        cfg.parse_config(raw, where="grm.yaml")
    raw = _raw(apps)
    raw["features"][2]["hotness"] = [0, 3]
    with pytest.raises(ValueError, match=r"feature 'user_segment': hotness must be 1"):
        cfg.parse_config(raw, where="grm.yaml")


def test_model_argument_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"sequence_feature 'history' is not a feature"):
        models.GRM(make_embedding(), sequence_feature="history")
    with pytest.raises(ValueError, match=r"hidden_dim \(10\) must be a multiple of num_heads \(4\)"):
        models.GRM(make_embedding(), hidden_dim=10, num_heads=4)
    with pytest.raises(ValueError, match=r"attention_norm must be 'causal' or a positive int"):
        models.GRM(make_embedding(), attention_norm=0)
    combined = fr.FusedEmbedding([fr.Feature("items", 4, combiner="sum"), fr.Feature("device", 4)],
                                 name=f"grm_sparse_sum_{next(_names)}")
    with pytest.raises(ValueError, match=r"sequence feature 'items' needs combiner None"):
        models.GRM(combined)
    model = make_model()
    padded = dict(batch([2, 3]), items=tf.constant([[1, 2, -1], [3, 4, 5]], tf.int64))
    with pytest.raises(ValueError, match=r"feature 'items' must be fed as a tf.RaggedTensor"):
        model(padded)


def test_the_dlrm_baseline_on_sequences():
    """configs/grm_synthetic_dlrm.yaml: the GRM's data with a DLRM that pools the history (combiner mean) and gives a
    logit per task: [B, 2] logits on a batch with empty and long histories, finite, and a trained step lowers the
    loss on that batch."""
    import pathlib  # noqa: PLC0415

    config = cfg.load_config(str(pathlib.Path(__file__).resolve().parents[2] / "configs/grm_synthetic_dlrm.yaml"))
    assert config.model.name == "dlrm" and config.data.source == "grm_synthetic"
    features = config.embedding_features()
    assert {f.name: f.combiner for f in features}["items"] == "mean"
    embedding = fr.FusedEmbedding(features, optimizer={"name": "adagrad", "learning_rate": 0.1},
                                  name=f"grm_dlrm_{next(_names)}")
    model = experiment.make_model(config, embedding)
    assert isinstance(model, models.DLRM) and model.tasks == 2
    inputs = dict(batch([3, 0, 7, 1]), user_segment=tf.constant([1, 2, 3, 4], tf.int64))
    labels = tf.constant([[1, 1], [0, 0], [1, 0], [0, 0]], tf.float32)
    optimizer = fr.train.make_optimizer(model, default={"name": "adam", "learning_rate": 0.01})

    def loss():
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, model(inputs, training=True)))

    logits = model(inputs)
    assert logits.shape == (4, 2) and np.isfinite(logits.numpy()).all()
    before = float(loss())
    for _ in range(5):
        with tf.GradientTape() as tape:
            value = loss()
        optimizer.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
    assert float(loss()) < before
    with pytest.raises(ValueError, match="DLRM: tasks must be a positive int, got 0"):
        models.DLRM(embedding, num_dense=0, tasks=0)
