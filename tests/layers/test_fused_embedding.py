"""fr.FusedEmbedding (one process) against the NumPy reference in tests/layers/reference.py.

A fresh layer's rows are the Hashed initial rows of (feature, id), so every output is known in advance; after one
plain-SGD step each touched row must have moved by exactly minus its gradient, computed in NumPy. Tests run eagerly
and in a tf.function traced with unknown shapes, and over int32 / int64 ids where the dtype matters.
"""

import dataclasses
import json

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tests.layers import reference as ref

MODES = ["eager", "function"]


def names(feature):
    """A regex matching the feature's name as an error message quotes it ('name', or \\'name\\' where a graph-mode
    assertion escapes the quotes)."""
    return r"\\?'" + feature + r"\\?'"


INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


@pytest.fixture(params=[tf.int32, tf.int64], ids=["int32", "int64"])
def key_dtype(request):
    return request.param


# --------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------

def inputs_of(features, batch, row_splits_dtype="int64"):
    return {f.name: ref.to_tf(batch[f.name], f.key_dtype, row_splits_dtype) for f in features}


def rows_fn_for(feature, rows_fn):
    return lambda ids: rows_fn(feature.name, ids, feature.dim)


def expected_outputs(features, batch, rows_fn=None):
    rows_fn = rows_fn or ref.hashed_initial()
    return {f.name: ref.embed(batch[f.name], rows_fn_for(f, rows_fn), f.combiner, f.dim) for f in features}


def check_outputs(out, features, batch, rows_fn=None, atol=1e-6):
    """Every feature's output equals the reference; output kinds (ragged or dense) and static dims are right."""
    assert sorted(out) == sorted(f.name for f in features)
    want = expected_outputs(features, batch, rows_fn)
    for f in features:
        got = out[f.name]
        ragged_out = ref.is_ragged(batch[f.name]) and f.combiner is None
        assert isinstance(got, tf.RaggedTensor) == ragged_out, f"{f.name}: output type {type(got).__name__}"
        assert got.dtype == tf.float32
        assert got.shape[-1] == f.dim, f"{f.name}: static shape {got.shape}"
        ref.assert_close(ref.to_numpy(got), want[f.name], f.name, atol=atol)
    return want


def run_and_check(layer, features, batch, mode, training=None, rows_fn=None, row_splits_dtype="int64"):
    out = ref.call_layer(layer, inputs_of(features, batch, row_splits_dtype), mode, training)
    check_outputs(out, features, batch, rows_fn)
    return out


def table_sizes(layer):
    return [int(t.params.size()) for t in layer.tables]


def group_of(layer, feature):
    index = next(i for i, g in enumerate(layer.groups) if feature in g.feature_names)
    return index, layer.groups[index]


def table_rows(layer, feature, ids):
    """(rows [n, dim], exists [n]) that the layer's table holds for (feature, id), keyed by the unified key."""
    index, group = group_of(layer, feature)
    keys = ref.unified_keys(ids, group.feature_names.index(feature), group.num_categories, group.encoding)
    values, exists = layer.tables[index].params.lookup(tf.constant(keys, tf.int64), return_exists=True)
    return values.numpy(), exists.numpy()


def expected_table_keys(layer, batch):
    """Per table, the sorted unified keys of every (feature, id) pair of the batch."""
    keys = []
    for group in layer.groups:
        k = [ref.unified_keys(np.unique(ref.valid_ids(batch[name])), c, group.num_categories, group.encoding)
             for c, name in enumerate(group.feature_names)]
        keys.append(np.sort(np.concatenate(k)) if k else np.zeros([0], np.int64))
    return keys


def table_keys(layer):
    return [np.sort(t.params.export()[0].numpy()) for t in layer.tables]


def stats_numpy(layer):
    return {f: {k: int(v) for k, v in d.items()} for f, d in layer.statistics().items()}


# --------------------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------------------

def mixed_features(key_dtype=tf.int64, **feature_kwargs):
    """Two spec groups (dim 4 and dim 3), every input layout and combiner, int32 and int64 side by side."""
    return [
        fr.Feature("user", 4, key_dtype=key_dtype, **feature_kwargs),
        fr.Feature("item", 4, **feature_kwargs),
        fr.Feature("hist", 4, key_dtype=key_dtype, **feature_kwargs),
        fr.Feature("tags", 3, combiner="mean", key_dtype=key_dtype, **feature_kwargs),
        fr.Feature("genres", 3, combiner="sum", **feature_kwargs),
        fr.Feature("topics", 3, combiner="sqrtn", key_dtype=key_dtype, **feature_kwargs),
        fr.Feature("cats", 3, **feature_kwargs),
    ]


def mixed_batch():
    """B = 4. Ids collide across features (7 and 3 everywhere), repeat inside a feature and inside a row; there is an
    all-padding row and empty ragged rows."""
    return {
        "user": np.array([7, 3, 7, 0]),
        "item": np.array([7, 3, 9, 0]),
        "hist": np.array([[7, -1, 3], [-1, -1, -1], [5, 5, -1], [0, 7, 7]]),
        "tags": [[7, 1], [], [3, 3, 3], [2]],
        "genres": np.array([[1, 2, -1], [-1, -1, -1], [7, 7, 1], [3, -1, -1]]),
        "topics": [[], [1, 7, 4], [4], []],
        "cats": [[7], [], [1, 2, 1], [3]],
    }


def combiner_features(key_dtype):
    return [fr.Feature(f"{layout}_{combiner or 'none'}", 3, combiner=combiner, key_dtype=key_dtype)
            for layout in ("dense", "ragged") for combiner in (None, "sum", "mean", "sqrtn")]


def combiner_batch(seed=0):
    rng = np.random.default_rng(seed)
    batch = {}
    for combiner in (None, "sum", "mean", "sqrtn"):
        name = combiner or "none"
        dense = rng.integers(0, 6, (5, 4))
        dense[rng.random((5, 4)) < 0.4] = -1
        dense[1] = -1  # an all-padding row
        batch[f"dense_{name}"] = dense
        lengths = rng.integers(0, 5, 5)
        lengths[2] = 0  # an empty row
        batch[f"ragged_{name}"] = [list(rng.integers(0, 6, n)) for n in lengths]
    return batch


# --------------------------------------------------------------------------------------------------------------
# 1. Forward outputs equal the reference
# --------------------------------------------------------------------------------------------------------------

def test_single_feature(mode, key_dtype):
    features = [fr.Feature("user_id", 5, key_dtype=key_dtype)]
    layer = fr.FusedEmbedding(features)
    batch = {"user_id": np.array([3, 1, 3, 42, 0, 1000])}
    run_and_check(layer, features, batch, mode)
    assert len(layer.groups) == 1 and layer.groups[0].feature_names == ("user_id",)
    assert table_sizes(layer) == [5]


def test_several_features_in_two_groups(mode, key_dtype):
    features = mixed_features(key_dtype)
    layer = fr.FusedEmbedding(features)
    assert [g.feature_names for g in layer.groups] == [
        ("cats", "genres", "tags", "topics"), ("hist", "item", "user")]
    batch = mixed_batch()
    out = run_and_check(layer, features, batch, mode)
    # The same id in two categories is two different rows (deferred hashing loses nothing).
    user, item, hist = out["user"].numpy(), out["item"].numpy(), out["hist"].numpy()
    assert not np.allclose(user[0], item[0])  # id 7 of user vs id 7 of item, same group
    assert not np.allclose(user[0], hist[0, 0])
    np.testing.assert_array_equal(user[0], user[2])  # the same (feature, id) twice: the same row
    np.testing.assert_array_equal(hist[1], np.zeros([3, 4], np.float32))  # all-padding row
    assert sorted(map(tuple, table_keys(layer))) == sorted(map(tuple, expected_table_keys(layer, batch)))


def test_combiners_and_layouts(mode, key_dtype):
    features = combiner_features(key_dtype)
    layer = fr.FusedEmbedding(features)
    assert len(layer.groups) == 1 and layer.groups[0].num_categories == 8
    # Ragged row splits of either dtype (int32 ones with the int32 ids).
    row_splits_dtype = "int32" if key_dtype == tf.int32 else "int64"
    run_and_check(layer, features, combiner_batch(), mode, row_splits_dtype=row_splits_dtype)


def test_one_dimensional_ids_with_combiner_and_padding(mode):
    # [B] ids with a combiner: one id per example; -1 (padding) gives a zero row.
    features = [fr.Feature("s", 2, combiner="sum"), fr.Feature("m", 2, combiner="mean"), fr.Feature("n", 2)]
    layer = fr.FusedEmbedding(features)
    batch = {"s": np.array([4, -1, 4]), "m": np.array([-1, 5, 6]), "n": np.array([1, -1, 1])}
    out = run_and_check(layer, features, batch, mode)
    np.testing.assert_array_equal(out["n"].numpy()[1], np.zeros(2, np.float32))


def test_empty_batch(mode, key_dtype):
    features = [
        fr.Feature("one", 4, key_dtype=key_dtype), fr.Feature("one_sum", 4, combiner="sum", key_dtype=key_dtype),
        fr.Feature("dense", 4, key_dtype=key_dtype), fr.Feature("dense_mean", 4, combiner="mean"),
        fr.Feature("rag", 2, key_dtype=key_dtype), fr.Feature("rag_sqrtn", 2, combiner="sqrtn"),
    ]
    layer = fr.FusedEmbedding(features)
    batch = {"one": np.zeros([0], np.int64), "one_sum": np.zeros([0], np.int64),
             "dense": np.zeros([0, 3], np.int64), "dense_mean": np.zeros([0, 3], np.int64),
             "rag": [], "rag_sqrtn": []}
    out = run_and_check(layer, features, batch, mode)
    assert out["dense"].numpy().shape == (0, 3, 4)
    assert out["rag"].nrows() == 0 and out["rag_sqrtn"].numpy().shape == (0, 2)
    assert table_sizes(layer) == [0, 0]
    assert all(v == {"ids": 0, "unique_sent": 0, "unique_looked_up": 0, "hot_hits": 0} for v in stats_numpy(layer).values())


def test_all_padding_batch_inserts_nothing(mode):
    features = [fr.Feature("d", 3), fr.Feature("r", 3, combiner="mean"), fr.Feature("s", 3, combiner="sum")]
    layer = fr.FusedEmbedding(features)
    batch = {"d": np.full([2, 3], -1), "r": [[], []], "s": np.full([2, 2], -1)}
    out = run_and_check(layer, features, batch, mode)
    assert not np.any(out["d"].numpy())
    assert table_sizes(layer) == [0]


def test_extreme_ids(mode, key_dtype):
    top = INT64_MAX if key_dtype == tf.int64 else INT32_MAX
    features = [fr.Feature("x", 4, key_dtype=key_dtype), fr.Feature("y", 4, combiner="sum", key_dtype=key_dtype),
                fr.Feature("z", 4, key_dtype=key_dtype)]
    layer = fr.FusedEmbedding(features)
    assert layer.groups[0].encoding == "hashed"
    batch = {"x": np.array([0, top, top - 1, 1]), "y": np.array([[top, 0], [-1, top]]), "z": [[top, top], [0]]}
    run_and_check(layer, features, batch, mode)
    rows, exists = table_rows(layer, "x", [0, top])
    assert exists.all()
    np.testing.assert_allclose(rows, ref.initial_rows("x", [0, top], 4), atol=1e-7)


def test_repeated_calls_keep_rows_and_grow_the_table(mode):
    features = mixed_features()
    layer = fr.FusedEmbedding(features)
    batch = mixed_batch()
    run_and_check(layer, features, batch, mode)
    first_keys = table_keys(layer)
    run_and_check(layer, features, batch, mode)  # the same rows, nothing new
    for got, want in zip(table_keys(layer), first_keys):
        np.testing.assert_array_equal(got, want)
    batch2 = {k: (v + 100 if not ref.is_ragged(v) else [[i + 100 for i in r] for r in v]) for k, v in batch.items()}
    for k in ("hist", "genres"):
        batch2[k] = np.where(batch[k] == -1, -1, batch2[k])
    run_and_check(layer, features, batch2, mode)
    both = [np.sort(np.concatenate([a, b])) for a, b in zip(expected_table_keys(layer, batch),
                                                            expected_table_keys(layer, batch2))]
    for got, want in zip(table_keys(layer), both):
        np.testing.assert_array_equal(got, want)


def test_feature_and_layer_initializers(mode):
    features = [
        fr.Feature("a", 3),  # the layer default
        fr.Feature("b", 3, combiner="sum"),
        fr.Feature("c", 3, initializer=fr.initializers.Hashed(seed=5, stddev=0.2)),
        fr.Feature("d", 3, combiner="mean", initializer=fr.initializers.Constant(0.25)),
        fr.Feature("e", 3, initializer=fr.initializers.Zeros()),
    ]
    layer = fr.FusedEmbedding(features, initializer=fr.initializers.Hashed(seed=3, stddev=0.1))
    assert len(layer.groups) == 4

    def rows_fn(name, ids, dim):
        if name in ("a", "b"):
            return ref.initial_rows(name, ids, dim, seed=3, stddev=0.1)
        if name == "c":
            return ref.initial_rows(name, ids, dim, seed=5, stddev=0.2)
        return np.full((len(ids), dim), 0.25 if name == "d" else 0.0, np.float32)

    batch = {"a": np.array([1, 2]), "b": np.array([[1, 2], [2, -1]]), "c": np.array([1, 9]),
             "d": [[1, 2, 3], []], "e": np.array([4, 4])}
    run_and_check(layer, features, batch, mode, rows_fn=rows_fn)


UNUSUAL_NAMES = ["user id", "a/b", "über", "x:0", "1st"]


def test_unusual_feature_names(mode):
    # A feature name is only a dict key: spaces, slashes, colons and non-ASCII letters are fine.
    features = [fr.Feature(n, 2, combiner="sum" if i % 2 else None) for i, n in enumerate(UNUSUAL_NAMES)]
    batch = {n: np.array([[1, 2], [3, -1]]) for n in UNUSUAL_NAMES}
    run_and_check(fr.FusedEmbedding(features), features, batch, mode)


# --------------------------------------------------------------------------------------------------------------
# 2. Ablations give the same outputs
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ablation", [dict(dedup="none"), dict(fusion="source_hash")],
                         ids=["dedup_none", "source_hash"])
def test_ablations_match_default(mode, ablation):
    features = mixed_features(tf.int32)
    if "fusion" in ablation:
        # With source hashing the owner sees fused keys only; packed keys still carry the category, so new rows start
        # where the default's do (hashed keys start from rows of the fused key: see test_source_hash_hashed_rows).
        features = [dataclasses.replace(f, max_id_bits=31) for f in features]
    batch = mixed_batch()
    default = fr.FusedEmbedding(features)
    want = ref.call_layer(default, inputs_of(features, batch), mode)
    check_outputs(want, features, batch)
    layer = fr.FusedEmbedding(features, **ablation)
    got = ref.call_layer(layer, inputs_of(features, batch), mode)
    for f in features:
        w = ref.to_numpy(want[f.name])
        ref.assert_close(ref.to_numpy(got[f.name]), w, f"{f.name} ({ablation})")
    # One row per (feature, id) either way.
    assert table_sizes(layer) == table_sizes(default)


def test_source_hash_hashed_rows(mode):
    # Hashed groups under source hashing: rows are a deterministic function of the fused key, the same in any layer.
    features = mixed_features(tf.int32)
    batch = mixed_batch()
    a = ref.call_layer(fr.FusedEmbedding(features, fusion="source_hash"), inputs_of(features, batch), mode)
    b = ref.call_layer(fr.FusedEmbedding(features, fusion="source_hash"), inputs_of(features, batch), mode)
    for f in features:
        ref.assert_close(ref.to_numpy(a[f.name]), ref.to_numpy(b[f.name]), f.name)


# --------------------------------------------------------------------------------------------------------------
# 3. Packed encoding
# --------------------------------------------------------------------------------------------------------------

def packed_features(key_dtype=tf.int64):
    return [
        fr.Feature("p_user", 4, key_dtype=key_dtype, max_id_bits=20),
        fr.Feature("p_item", 4, max_id_bits=20),
        fr.Feature("p_tags", 4, combiner="mean", key_dtype=key_dtype, max_id_bits=16),
        fr.Feature("h_a", 2, max_id_bits=20),
        fr.Feature("h_b", 2),  # no bound: the dim-2 group is hashed
    ]


def packed_batch():
    return {"p_user": np.array([0, 2**20 - 1, 5]), "p_item": np.array([5, 5, 2**20 - 1]),
            "p_tags": [[5, 2**16 - 1], [], [0]], "h_a": np.array([5, 6, 7]), "h_b": np.array([5, 2**40, 7])}


def test_packed_encoding_outputs_and_keys(mode, key_dtype):
    features = packed_features(key_dtype)
    layer = fr.FusedEmbedding(features)
    encodings = {g.feature_names: (g.encoding, g.max_id_bits) for g in layer.groups}
    assert encodings == {("p_item", "p_tags", "p_user"): ("packed", 20), ("h_a", "h_b"): ("hashed", None)}
    batch = packed_batch()
    run_and_check(layer, features, batch, mode)
    # Packed keys are (category << (63 - b)) | id: lossless, readable back.
    index, group = group_of(layer, "p_user")
    keys = np.sort(layer.tables[index].params.export()[0].numpy())
    np.testing.assert_array_equal(keys, expected_table_keys(layer, batch)[index])
    shift = 63 - ref.packed_segment_bits(group.num_categories)
    assert set((keys >> shift).tolist()) == {0, 1, 2}


@pytest.mark.parametrize("where", ["p_item", "p_tags"])
def test_packed_id_out_of_range_is_an_error_naming_the_feature(mode, where):
    features = packed_features()
    layer = fr.FusedEmbedding(features)
    batch = packed_batch()
    run_and_check(layer, features, batch, "eager")
    sizes, stats = table_sizes(layer), stats_numpy(layer)
    bad = {k: (v.copy() if not ref.is_ragged(v) else [list(r) for r in v]) for k, v in batch.items()}
    bad["p_user"] = np.array([11, 12, 13])  # new ids that would be inserted
    if where == "p_item":
        bad["p_item"] = np.array([1, 2**20, 3])
    else:
        bad["p_tags"] = [[1], [2**16 + 5], []]
    with pytest.raises(tf.errors.InvalidArgumentError, match=names(where)):
        out = ref.call_layer(layer, inputs_of(features, bad), mode)
        [ref.to_numpy(v) for v in out.values()]
    assert table_sizes(layer) == sizes
    assert stats_numpy(layer) == stats


# --------------------------------------------------------------------------------------------------------------
# 5. Errors name the feature and never touch a table
# --------------------------------------------------------------------------------------------------------------

def two_group_layer():
    features = [fr.Feature("aa", 4), fr.Feature("bb", 4, combiner="sum"), fr.Feature("cc", 2, key_dtype=tf.int32),
                fr.Feature("dd", 2, combiner="mean")]
    batch = {"aa": np.array([1, 2]), "bb": np.array([[1, -1], [3, 4]]), "cc": np.array([5, 6]), "dd": [[1], [2, 3]]}
    return fr.FusedEmbedding(features), features, batch


def assert_error_changes_nothing(layer, features, batch, bad_inputs, mode, errors, match):
    run_and_check(layer, features, batch, "eager")  # rows in the tables, statistics set
    sizes, keys, stats = table_sizes(layer), table_keys(layer), stats_numpy(layer)
    with pytest.raises(errors, match=match):
        out = ref.call_layer(layer, bad_inputs, mode)
        [ref.to_numpy(v) for v in out.values()]
    assert table_sizes(layer) == sizes
    for got, want in zip(table_keys(layer), keys):
        np.testing.assert_array_equal(got, want)
    assert stats_numpy(layer) == stats


def test_missing_and_unknown_feature(mode):
    layer, features, batch = two_group_layer()
    inputs = inputs_of(features, batch)
    missing = {k: v for k, v in inputs.items() if k != "cc"}
    assert_error_changes_nothing(layer, features, batch, missing, mode, ValueError, names("cc"))
    unknown = dict(inputs, zz=tf.constant([1, 2], tf.int64))
    with pytest.raises(ValueError, match=names("zz")):
        ref.call_layer(layer, unknown, mode)


@pytest.mark.parametrize("case", ["float", "int32_for_int64", "int64_for_int32", "float_ragged"])
def test_wrong_dtype(mode, case):
    layer, features, batch = two_group_layer()
    inputs = inputs_of(features, batch)
    name = {"float": "aa", "int32_for_int64": "bb", "int64_for_int32": "cc", "float_ragged": "dd"}[case]
    if case == "float":
        inputs[name] = tf.constant([1.0, 2.0])
    elif case == "int32_for_int64":
        inputs[name] = tf.constant([[1, -1], [3, 4]], tf.int32)
    elif case == "int64_for_int32":
        inputs[name] = tf.constant([5, 6], tf.int64)
    else:
        inputs[name] = tf.ragged.constant([[1.0], [2.0, 3.0]])
    assert_error_changes_nothing(layer, features, batch, inputs, mode, (TypeError, ValueError), names(name))


@pytest.mark.parametrize("case", ["rank3", "ragged_rank2", "scalar"])
def test_wrong_rank(mode, case):
    layer, features, batch = two_group_layer()
    inputs = inputs_of(features, batch)
    if case == "rank3":
        inputs["bb"] = tf.constant([[[1, 2]], [[3, 4]]], tf.int64)
        name = "bb"
    elif case == "ragged_rank2":
        inputs["dd"] = tf.ragged.constant([[[1]], [[2, 3]]], tf.int64)
        name = "dd"
    else:
        inputs["aa"] = tf.constant(1, tf.int64)
        name = "aa"
    assert_error_changes_nothing(layer, features, batch, inputs, mode, ValueError, names(name))


@pytest.mark.parametrize("case", ["dense1", "dense2_min", "ragged", "int32"])
def test_negative_id_is_an_invalid_argument_naming_the_feature(mode, case):
    layer, features, batch = two_group_layer()
    bad = dict(batch)
    # Every other feature brings new ids, which a partial call would insert.
    bad.update({"aa": np.array([10, 11]), "bb": np.array([[12, -1], [13, 14]]), "cc": np.array([15, 16]),
                "dd": [[17], [18, 19]]})
    name = {"dense1": "aa", "dense2_min": "bb", "ragged": "dd", "int32": "cc"}[case]
    if case == "dense1":
        bad["aa"] = np.array([10, -2])
    elif case == "dense2_min":
        bad["bb"] = np.array([[12, -(2**63)], [13, 14]])
    elif case == "ragged":
        bad["dd"] = [[17], [-5, 19]]
    else:
        bad["cc"] = np.array([-(2**31), 16])
    assert_error_changes_nothing(layer, features, batch, inputs_of(features, bad), mode,
                                 tf.errors.InvalidArgumentError, names(name))


def test_construction_errors_name_the_feature():
    with pytest.raises(ValueError, match="'dup'"):
        fr.FusedEmbedding([fr.Feature("dup", 4), fr.Feature("ok", 4), fr.Feature("dup", 8)])
    with pytest.raises(ValueError, match="'zero'"):
        fr.FusedEmbedding([fr.Feature("zero", 0)])
    with pytest.raises(ValueError, match="'neg'"):
        fr.FusedEmbedding([{"name": "neg", "dim": -2}])
    with pytest.raises(ValueError, match="'comb'"):
        fr.FusedEmbedding([fr.Feature("ok", 4), fr.Feature("comb", 4, combiner="max")])
    with pytest.raises(ValueError, match="'comb'"):
        fr.FusedEmbedding([{"name": "comb", "dim": 4, "combiner": "avg"}])
    with pytest.raises(ValueError, match="dedup"):
        fr.FusedEmbedding([fr.Feature("a", 4)], dedup="all")
    with pytest.raises(ValueError, match="fusion"):
        fr.FusedEmbedding([fr.Feature("a", 4)], fusion="early")
    with pytest.raises(ValueError):
        fr.FusedEmbedding([])
    with pytest.raises(ValueError):
        fr.FusedEmbedding(fr.Feature("a", 4))
    with pytest.raises(ValueError, match="optimizer"):
        fr.FusedEmbedding([fr.Feature("a", 4)], optimizer="lamb")


# --------------------------------------------------------------------------------------------------------------
# 6. Inference
# --------------------------------------------------------------------------------------------------------------

def test_training_false_inserts_nothing_and_matches_training(mode):
    features = mixed_features(tf.int32)
    batch = mixed_batch()
    inference = fr.FusedEmbedding(features)
    got = run_and_check(inference, features, batch, mode, training=False)
    assert table_sizes(inference) == [0, 0]
    training = fr.FusedEmbedding(features)
    want = run_and_check(training, features, batch, mode, training=True)
    assert table_sizes(training) == [len(k) for k in expected_table_keys(training, batch)]
    for f in features:
        ref.assert_close(ref.to_numpy(got[f.name]), ref.to_numpy(want[f.name]), f.name)
    # Inference after training reads the stored rows (the same here) and still inserts nothing new.
    sizes = table_sizes(training)
    run_and_check(training, features, batch, mode, training=False)
    assert table_sizes(training) == sizes


# --------------------------------------------------------------------------------------------------------------
# 7. Statistics
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ablation", [dict(), dict(fusion="source_hash"), dict(dedup="none")],
                         ids=["default", "source_hash", "dedup_none"])
def test_statistics(mode, ablation):
    features = mixed_features()
    layer = fr.FusedEmbedding(features, **ablation)
    assert stats_numpy(layer) == {f.name: {"ids": 0, "unique_sent": 0, "unique_looked_up": 0, "hot_hits": 0} for f in features}
    for batch in (mixed_batch(), second_mixed_batch()):
        ref.call_layer(layer, inputs_of(features, batch), mode)
        stats = stats_numpy(layer)
        assert sorted(stats) == sorted(f.name for f in features)
        for f in features:
            ids, unique = ref.id_counts(batch[f.name])
            looked_up = -1 if ablation.get("fusion") == "source_hash" else unique
            want = {"ids": ids, "unique_sent": unique, "unique_looked_up": looked_up, "hot_hits": 0}
            if ablation.get("dedup") == "none":
                del want["unique_sent"], stats[f.name]["unique_sent"]  # duplicates are sent on purpose
            assert stats[f.name] == want, f.name


def second_mixed_batch():
    """A second batch for the mixed features: other ids, other counts."""
    rng = np.random.default_rng(5)
    batch = {}
    for f, v in mixed_batch().items():
        if ref.is_ragged(v):
            batch[f] = [list(rng.integers(0, 4, rng.integers(0, 4))) for _ in range(3)]
        elif v.ndim == 1:
            batch[f] = rng.integers(0, 4, 3)
        else:
            batch[f] = np.where(rng.random((3, 2)) < 0.3, -1, rng.integers(0, 4, (3, 2)))
    return batch


# --------------------------------------------------------------------------------------------------------------
# 8. Gradients and the SGD update
# --------------------------------------------------------------------------------------------------------------

def upstream_weights(features, batch, seed=0):
    """Fixed random W_f shaped like each output (a list of [len_b, dim] arrays for a ragged output)."""
    rng = np.random.default_rng(seed)
    weights = {}
    for f in features:
        ids = batch[f.name]
        if ref.is_ragged(ids):
            weights[f.name] = ([rng.normal(size=(len(r), f.dim)).astype(np.float32) for r in ids]
                               if f.combiner is None else rng.normal(size=(len(ids), f.dim)).astype(np.float32))
        else:
            ids = np.asarray(ids)
            shape = ids.shape + (f.dim,) if (f.combiner is None or ids.ndim == 1) else (ids.shape[0], f.dim)
            weights[f.name] = rng.normal(size=shape).astype(np.float32)
    return weights


def weighted_loss(out, weights):
    total = 0.0
    for name, w in weights.items():
        o = out[name]
        if isinstance(o, tf.RaggedTensor):
            flat = np.concatenate(w).reshape(-1, o.flat_values.shape[-1])
            total += tf.reduce_sum(o.flat_values * tf.constant(flat))
        else:
            total += tf.reduce_sum(o * tf.constant(w))
    return total


def sgd_step(layer, features, batch, weights, mode):
    optimizer = fr.train.make_optimizer(layer, default="sgd")
    inputs = inputs_of(features, batch)

    def step(x):
        with tf.GradientTape() as tape:
            loss = weighted_loss(layer(x, training=True), weights)
        variables = layer.trainable_variables
        grads = tape.gradient(loss, variables)
        assert all(g is not None for g in grads)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    if mode == "function":
        step = tf.function(step, input_signature=[{k: ref.spec_of(v) for k, v in inputs.items()}])
    return float(step(inputs))


def test_sgd_update_equals_numpy_gradient(mode, key_dtype):
    lr = 1.0
    features = mixed_features(key_dtype)
    layer = fr.FusedEmbedding(features, optimizer={"name": "sgd", "learning_rate": lr})
    assert len(layer.trainable_variables) == len(layer.groups) == 2
    batch = mixed_batch()
    weights = upstream_weights(features, batch)
    loss = sgd_step(layer, features, batch, weights, mode)
    want_loss = sum(float(np.sum(np.concatenate(o) * np.concatenate(weights[n])) if isinstance(o, list)
                          else np.sum(o * weights[n]))
                    for n, o in expected_outputs(features, batch).items())
    assert loss == pytest.approx(want_loss, rel=1e-5, abs=1e-6)
    for f in features:
        grads = ref.row_gradients(batch[f.name], weights[f.name], f.combiner, f.dim)
        ids = sorted(grads)
        rows, exists = table_rows(layer, f.name, ids)
        assert exists.all(), f.name
        want = ref.initial_rows(f.name, ids, f.dim) - lr * np.stack([grads[i] for i in ids])
        np.testing.assert_allclose(rows, want, atol=2e-6, rtol=1e-5, err_msg=f.name)
    # Exactly the batch's (feature, id) pairs are stored: nothing extra, nothing lost.
    for got, want in zip(table_keys(layer), expected_table_keys(layer, batch)):
        np.testing.assert_array_equal(got, want)
    # Inference now reads the updated rows.
    updated = lambda name, ids, dim: table_rows(layer, name, ids)[0]  # noqa: E731
    out = ref.call_layer(layer, inputs_of(features, batch), mode, training=False)
    check_outputs(out, features, batch, rows_fn=updated)


def test_each_group_uses_its_own_optimizer(mode):
    features = [
        fr.Feature("s1", 2, optimizer={"name": "sgd", "learning_rate": 0.5}),
        fr.Feature("s2", 2, combiner="mean", optimizer={"name": "sgd", "learning_rate": 0.5}),
        fr.Feature("ada", 2, optimizer={"name": "adagrad", "learning_rate": 0.3, "initial_accumulator_value": 0.1}),
        fr.Feature("const", 2, combiner="sum", initializer=fr.initializers.Constant(0.25),
                   optimizer={"name": "sgd", "learning_rate": 1.0}),
    ]
    layer = fr.FusedEmbedding(features, optimizer="adam")
    assert [g.feature_names for g in layer.groups] == [("ada",), ("const",), ("s1", "s2")]
    batch = {"s1": np.array([1, 1, 2]), "s2": np.array([[1, 2], [2, -1], [-1, -1]]), "ada": np.array([1, 3, 3]),
             "const": np.array([[4, 4], [5, -1], [-1, -1]])}
    weights = upstream_weights(features, batch, seed=3)
    dense = tf.Variable([1.0, -1.0])
    optimizer = fr.train.make_optimizer(layer, default={"name": "sgd", "learning_rate": 0.1})
    inputs = inputs_of(features, batch)

    def step(x):
        with tf.GradientTape() as tape:
            loss = weighted_loss(layer(x, training=True), weights) + tf.reduce_sum(dense * dense)
        variables = layer.trainable_variables + [dense]
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    if mode == "function":
        step = tf.function(step)
    step(inputs)
    np.testing.assert_allclose(dense.numpy(), [0.8, -0.8], rtol=1e-6)  # default optimizer: SGD(0.1)
    for f in features:
        grads = ref.row_gradients(batch[f.name], weights[f.name], f.combiner, f.dim)
        ids = sorted(grads)
        g = np.stack([grads[i] for i in ids])
        rows, exists = table_rows(layer, f.name, ids)
        assert exists.all(), f.name
        if f.name == "const":
            want = 0.25 - 1.0 * g
        elif f.name == "ada":
            want = ref.initial_rows(f.name, ids, 2) - 0.3 * g / (np.sqrt(0.1 + g * g) + 1e-7)
        else:
            want = ref.initial_rows(f.name, ids, 2) - 0.5 * g
        np.testing.assert_allclose(rows, want, atol=2e-6, rtol=1e-5, err_msg=f.name)


@pytest.mark.parametrize("path", ["chain", "fused"])
def test_combiner_gradient_numerically(path):
    """tf.test.compute_gradient of the combine step alone (float64), through the layer's own code paths: the
    per-feature chain (unflatten_rows) and the fused layer's (one gather_segment_sum over a row buffer, then
    finish_rows), which must also agree with the chain exactly."""
    from tf_fusedrec.layers import _inputs  # noqa: PLC0415

    ids = tf.ragged.constant([[1, 2, 2], [], [3]], tf.int64)
    index = tf.constant([2, 0, 0, 1], tf.int32)  # each id's row in a buffer of 3 (duplicates share one)
    for combiner in ("sum", "mean", "sqrtn", None):
        feature = fr.Feature("f", 2, combiner=combiner)
        flat = _inputs.flatten_feature(feature, ids)

        def chain(buffer, flat=flat, feature=feature):
            out = _inputs.unflatten_rows(feature, tf.gather(buffer, index), flat.layout)
            return out.flat_values if isinstance(out, tf.RaggedTensor) else out

        def fused(buffer, flat=flat, feature=feature):
            segments, total = _inputs.output_segments(feature, flat.layout)
            sums, = fr.ops.gather_segment_sum(buffer, index, [segments], [total])
            out = _inputs.finish_rows(feature, sums, flat.layout)
            return out.flat_values if isinstance(out, tf.RaggedTensor) else out

        buffer = tf.constant(np.random.default_rng(0).normal(size=(3, 2)), tf.float64)
        combine = fused if path == "fused" else chain
        theoretical, numerical = tf.test.compute_gradient(combine, [buffer])
        np.testing.assert_allclose(theoretical[0], numerical[0], atol=1e-6, err_msg=str(combiner))
        np.testing.assert_array_equal(combine(buffer).numpy(), chain(buffer).numpy(), err_msg=str(combiner))


# --------------------------------------------------------------------------------------------------------------
# 9. Config round trip
# --------------------------------------------------------------------------------------------------------------

def config_features():
    return [
        fr.Feature("u", 4, key_dtype=tf.int32, max_id_bits=20),
        fr.Feature("v", 4, combiner="mean", max_id_bits=20),
        fr.Feature("w", 3, combiner="sqrtn", optimizer={"name": "sgd", "learning_rate": 0.5}),
        fr.Feature("x", 3, initializer=fr.initializers.Hashed(seed=7, stddev=0.3)),
    ]


@pytest.mark.parametrize("ablation", [dict(), dict(dedup="none", fusion="source_hash")], ids=["default", "ablation"])
def test_get_config_round_trip(ablation):
    features = config_features()
    layer = fr.FusedEmbedding(features, optimizer={"name": "adagrad", "learning_rate": 0.2},
                              initializer=fr.initializers.Hashed(seed=3, stddev=0.1), name="sparse", **ablation)
    config = layer.get_config()
    config = json.loads(json.dumps(config))  # plain JSON
    # The clone's tables take the layer's name: beside the original it must live in another variable scope.
    # (Keras' from_config re-raises the layer's ValueError as a TypeError with the same text.)
    with pytest.raises((ValueError, TypeError), match="an embedding table named 'sparse/group0.*already exists"):
        fr.FusedEmbedding.from_config(config)
    with tf.compat.v1.variable_scope("clone"):
        clone = fr.FusedEmbedding.from_config(config)
    assert clone.get_config() == layer.get_config()
    assert (clone.dedup, clone.fusion) == (layer.dedup, layer.fusion)

    def describe(l):
        return [(g.feature_names, g.spec, g.encoding, g.max_id_bits, g.index, g.name) for g in l.groups]

    assert describe(clone) == describe(layer)
    # Keras' own serialization finds the registered class.
    with tf.compat.v1.variable_scope("again"):
        again = tf.keras.layers.deserialize(tf.keras.layers.serialize(layer))
    assert isinstance(again, fr.FusedEmbedding) and describe(again) == describe(layer)

    def rows_fn(name, ids, dim):
        if name == "x":
            return ref.initial_rows(name, ids, dim, seed=7, stddev=0.3)
        return ref.initial_rows(name, ids, dim, seed=3, stddev=0.1)

    batch = {"u": np.array([1, 2**20 - 1]), "v": np.array([[1, 2], [-1, 3]]), "w": [[5], []], "x": np.array([1, 1])}
    if not ablation:
        for l in (layer, clone):
            run_and_check(l, features, batch, "eager", rows_fn=rows_fn)
    else:
        # The clone computes what the original computes (whatever the ablation's rows are).
        want = ref.call_layer(layer, inputs_of(features, batch), "eager")
        got = ref.call_layer(clone, inputs_of(features, batch), "eager")
        for f in features:
            ref.assert_close(ref.to_numpy(got[f.name]), ref.to_numpy(want[f.name]), f.name)


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64], ids=["int32", "int64"])
def test_id_violation_flags_equal_numpy_rules(mode, key_dtype):
    """The layer's value-rule flags (one per feature and rule, in violation_messages' order) equal the rules applied
    in NumPy: every layout, with and without max_id_bits, empty batches and ids at the bounds, random ids."""
    from tf_fusedrec.layers import _common  # noqa: PLC0415

    bits = {"user": 5, "hist": 3, "tags": 4, "topics": 2}
    features = [dataclasses.replace(f, max_id_bits=bits.get(f.name)) for f in mixed_features(key_dtype)]
    rng = np.random.default_rng(5)

    def numpy_flags(batch):
        flags = []
        for f in features:
            ids = batch[f.name]
            flat = np.concatenate([np.asarray(r, np.int64) for r in ids] + [np.zeros([0], np.int64)]) \
                if ref.is_ragged(ids) else np.asarray(ids, np.int64).ravel()
            flags.append(int(np.any(flat < -1)))
            if f.max_id_bits is not None:
                flags.append(int(np.any(flat >= 2**f.max_id_bits)))
        return flags

    def random_batch(b):
        out = {}
        for name, ids in mixed_batch().items():
            lo, hi = (-3, 40) if rng.random() < 0.5 else (-1, 2**bits.get(name, 6))
            if ref.is_ragged(ids):
                out[name] = [list(rng.integers(lo, hi, size=int(rng.integers(0, 4)))) for _ in range(b)]
            else:
                out[name] = rng.integers(lo, hi, size=(b,) + np.asarray(ids).shape[1:])
        return out

    fn = lambda inputs: _common.violation_flags(features, inputs)[0]  # noqa: E731
    fn = fn if mode == "eager" else tf.function(fn)
    batches = [mixed_batch(), random_batch(0)] + [random_batch(int(rng.integers(1, 6))) for _ in range(12)]
    edge = mixed_batch()
    edge["user"], edge["hist"] = np.array([31, -1, 0, -2]), np.array([[8, -1, 7], [0, 0, 0], [-1, -1, -1], [1, 2, 3]])
    batches.append(edge)
    for batch in batches:
        got = fn(inputs_of(features, batch)).numpy().tolist()
        assert got == numpy_flags(batch), batch
    assert any(any(numpy_flags(b)) for b in batches) and not all(any(numpy_flags(b)) for b in batches)
    assert len(_common.violation_messages(features)) == len(numpy_flags(mixed_batch()))


# --------------------------------------------------------------------------------------------------------------
# 10. tf.compat.v1 graph and session
# --------------------------------------------------------------------------------------------------------------

def test_v1_graph_session_forward_and_sgd_step():
    features = mixed_features(tf.int32)
    batch = mixed_batch()
    lr = 1.0
    with tf.Graph().as_default() as graph:
        layer = fr.FusedEmbedding(features, optimizer={"name": "sgd", "learning_rate": lr})
        placeholders, feed = {}, {}
        for f in features:
            ids = batch[f.name]
            if ref.is_ragged(ids):
                values = tf.compat.v1.placeholder(f.key_dtype, [None])
                lengths = tf.compat.v1.placeholder(tf.int64, [None])
                placeholders[f.name] = tf.RaggedTensor.from_row_lengths(values, lengths)
                feed[values] = np.concatenate([np.asarray(r, np.int64) for r in ids]).astype(f.key_dtype.as_numpy_dtype)
                feed[lengths] = np.array([len(r) for r in ids], np.int64)
            else:
                ph = tf.compat.v1.placeholder(f.key_dtype, [None] * np.asarray(ids).ndim)
                placeholders[f.name] = ph
                feed[ph] = np.asarray(ids).astype(f.key_dtype.as_numpy_dtype)
        inference = layer(placeholders, training=False)
        out = layer(placeholders, training=True)
        weights = upstream_weights(features, batch)
        loss = weighted_loss(out, weights)
        variables = layer.embedding_variables()
        optimizer = fr.train.make_optimizer(layer, default="sgd")
        train_op = optimizer.apply_gradients(zip(tf.gradients(loss, variables), variables))
        sizes = [t.params.size() for t in layer.tables]
        stats = layer.statistics()
        exports = [t.params.export() for t in layer.tables]
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(tf.compat.v1.tables_initializer())

            def fetch(outputs):
                return {k: ([np.asarray(r) for r in sess.run(v, feed).to_list()] if isinstance(v, tf.RaggedTensor)
                            else sess.run(v, feed)) for k, v in outputs.items()}

            got_inference = fetch(inference)
            assert sess.run(sizes) == [0, 0]
            got = fetch(out)
            got_sizes, got_stats = sess.run([sizes, stats])
            sess.run(train_op, feed)
            after = sess.run(exports)
    want = expected_outputs(features, batch)
    for f in features:
        for g in (got_inference, got):
            value = g[f.name]
            if isinstance(want[f.name], list):
                value = [np.asarray(r, np.float32).reshape(-1, f.dim) for r in value]
            ref.assert_close(value, want[f.name], f.name)
    assert got_sizes == [len(k) for k in expected_table_keys(layer, batch)]
    for f in features:
        ids, unique = ref.id_counts(batch[f.name])
        assert {k: int(v) for k, v in got_stats[f.name].items()} == {
            "ids": ids, "unique_sent": unique, "unique_looked_up": unique, "hot_hits": 0}, f.name
    # The SGD step in the session moved every touched row by -lr * gradient.
    for f in features:
        index, group = group_of(layer, f.name)
        keys, rows = after[index]
        by_key = dict(zip(keys.tolist(), rows))
        grads = ref.row_gradients(batch[f.name], weights[f.name], f.combiner, f.dim)
        ids = sorted(grads)
        unified = ref.unified_keys(ids, group.feature_names.index(f.name), group.num_categories, group.encoding)
        got_rows = np.stack([by_key[int(k)] for k in unified])
        want_rows = ref.initial_rows(f.name, ids, f.dim) - lr * np.stack([grads[i] for i in ids])
        np.testing.assert_allclose(got_rows, want_rows, atol=2e-6, rtol=1e-5, err_msg=f.name)
