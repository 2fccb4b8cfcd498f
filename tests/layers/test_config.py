"""fr.Feature, optimizer specs and the deterministic grouping of features into spec groups (FusedRec eq. 1)."""

import itertools
import json

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec import config as cfg


def groups_of(features, optimizer="adagrad", initializer=None):
    """The layer's groups as plain tuples: (feature_names, dim, optimizer name, encoding)."""
    layer = fr.FusedEmbedding(features, optimizer=optimizer, initializer=initializer)
    return [(g.feature_names, g.spec.dim, g.spec.optimizer.name, g.encoding) for g in layer.groups]


# --------------------------------------------------------------------------------------------------------------
# Feature
# --------------------------------------------------------------------------------------------------------------

def test_feature_defaults_and_dtype_normalisation():
    f = fr.Feature("user_id", 8)
    assert (f.combiner, f.initializer, f.optimizer, f.key_dtype, f.max_id_bits) == (None, None, None, tf.int64, None)
    assert fr.Feature("a", 2, key_dtype="int32").key_dtype == tf.int32
    assert fr.Feature("a", 2, key_dtype=np.int32).key_dtype == tf.int32
    assert fr.Feature("a", 2, optimizer="Adagrad").optimizer == cfg.OptimizerSpec("adagrad")


@pytest.mark.parametrize("kwargs, match", [
    (dict(dim=0), "dim"),
    (dict(dim=-3), "dim"),
    (dict(dim=2.0), "dim"),
    (dict(dim=True), "dim"),
    (dict(dim=4, combiner="max"), "combiner"),
    (dict(dim=4, combiner="SUM"), "combiner"),
    (dict(dim=4, key_dtype=tf.float32), "key_dtype"),
    (dict(dim=4, key_dtype=tf.int16), "key_dtype"),
    (dict(dim=4, max_id_bits=0), "max_id_bits"),
    (dict(dim=4, max_id_bits=64), "max_id_bits"),
    (dict(dim=4, max_id_bits="20"), "max_id_bits"),
    (dict(dim=4, optimizer="lamb"), "optimizer"),
    (dict(dim=4, optimizer={"learning_rate": 0.1}), "optimizer"),
])
def test_feature_rejects_bad_arguments_naming_it(kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        fr.Feature("my_feature", **kwargs)
    assert "my_feature" in str(info.value)


def test_feature_rejects_bad_name():
    for name in ("", None, 3):
        with pytest.raises(ValueError, match="name"):
            fr.Feature(name, 4)


def test_feature_config_round_trip():
    features = [
        fr.Feature("plain", 4),
        fr.Feature("full", 3, combiner="sqrtn", initializer=fr.initializers.Hashed(3, 0.2),
                   optimizer={"name": "adam", "learning_rate": 0.01, "beta_1": 0.8}, key_dtype=tf.int32,
                   max_id_bits=20),
        fr.Feature("const", 2, combiner="mean", initializer=fr.initializers.Constant(0.5), optimizer="sgd"),
    ]
    for f in features:
        config = f.get_config()
        config = json.loads(json.dumps(config))  # plain JSON
        back = fr.Feature.from_config(config)
        assert back.get_config() == f.get_config()
        assert (back.name, back.dim, back.combiner, back.key_dtype, back.max_id_bits, back.optimizer) == (
            f.name, f.dim, f.combiner, f.key_dtype, f.max_id_bits, f.optimizer)
        if fr.initializers.is_hashed(f.initializer):
            assert back.initializer == f.initializer
        if f.initializer is not None:
            assert cfg.initializer_key(back.initializer) == cfg.initializer_key(f.initializer)
    assert fr.Feature.from_config(features[1].get_config()) == features[1]


# --------------------------------------------------------------------------------------------------------------
# Optimizer specs
# --------------------------------------------------------------------------------------------------------------

def test_optimizer_spec_canonical_form():
    a = cfg.optimizer_spec({"name": "Adagrad", "learning_rate": 0.1, "initial_accumulator_value": 0.2})
    b = cfg.optimizer_spec({"initial_accumulator_value": 0.2, "learning_rate": 0.1, "name": "adagrad"})
    assert a == b and hash(a) == hash(b)
    assert a.config == (("initial_accumulator_value", 0.2), ("learning_rate", 0.1))
    assert cfg.optimizer_spec("sgd") == cfg.OptimizerSpec("sgd", ())
    assert cfg.optimizer_spec("sgd") != cfg.optimizer_spec({"name": "sgd", "learning_rate": 0.5})
    assert cfg.optimizer_spec(a) is a
    with pytest.raises(ValueError, match="unknown optimizer"):
        cfg.optimizer_spec("nadamw")
    # A Keras optimizer instance stands for its class and hyperparameters (tests/layers/test_keras_training.py).
    assert cfg.optimizer_spec(tf.keras.optimizers.SGD(0.25)).name == "sgd"
    with pytest.raises(ValueError, match="has no tf_fusedrec table update"):
        cfg.optimizer_spec(tf.keras.optimizers.Adamax())


def test_optimizer_spec_build():
    opt = cfg.optimizer_spec({"name": "sgd", "learning_rate": 0.25}).build()
    assert float(tf.keras.backend.get_value(opt.learning_rate)) == pytest.approx(0.25)
    for name in cfg.OPTIMIZER_NAMES:
        o1, o2 = cfg.optimizer_spec(name).build(), cfg.optimizer_spec(name).build()
        assert o1 is not o2  # one per table: state is never shared


# --------------------------------------------------------------------------------------------------------------
# Grouping
# --------------------------------------------------------------------------------------------------------------

def test_equal_specs_fuse_and_groups_are_sorted():
    features = [
        fr.Feature("zeta", 4), fr.Feature("alpha", 4, combiner="mean"), fr.Feature("mid", 8),
        fr.Feature("beta", 4, key_dtype=tf.int32), fr.Feature("gamma", 8, combiner="sum"),
    ]
    # Combiner and key dtype are not part of the spec; dim is.
    assert groups_of(features) == [
        (("alpha", "beta", "zeta"), 4, "adagrad", "hashed"),
        (("gamma", "mid"), 8, "adagrad", "hashed"),
    ]
    layer = fr.FusedEmbedding(features)
    assert [g.index for g in layer.groups] == [0, 1]
    assert [g.num_categories for g in layer.groups] == [3, 2]
    assert [g.name for g in layer.groups] == ["group0_d4_adagrad", "group1_d8_adagrad"]
    assert len(layer.tables) == 2


def test_grouping_is_independent_of_feature_order():
    features = [
        fr.Feature("c", 4), fr.Feature("a", 4, optimizer="sgd"), fr.Feature("d", 2), fr.Feature("b", 4),
        fr.Feature("e", 4, initializer=fr.initializers.Hashed(1)),
    ]
    expected = groups_of(features)
    for perm in itertools.islice(itertools.permutations(features), 0, 120, 17):
        assert groups_of(list(perm)) == expected
    groups, _ = cfg.group_features(features, cfg.optimizer_spec("adagrad"), fr.initializers.Hashed())
    # Ordered by first feature name; names sorted inside each group.
    assert [g.feature_names for g in groups] == [("a",), ("b", "c"), ("d",), ("e",)]


def test_differing_optimizer_initializer_or_dim_are_not_fused():
    base = dict(dim=4)
    features = [
        fr.Feature("f_default", **base),
        fr.Feature("f_default_by_name", **base, optimizer="adagrad"),  # equal to the layer default: fused
        fr.Feature("f_default_by_dict", **base, optimizer={"name": "adagrad"}),  # the same spec
        fr.Feature("f_lr", **base, optimizer={"name": "adagrad", "learning_rate": 0.5}),
        fr.Feature("f_sgd", **base, optimizer="sgd"),
        fr.Feature("f_sgd2", **base, optimizer="sgd"),
        fr.Feature("f_seed", **base, initializer=fr.initializers.Hashed(seed=1)),
        fr.Feature("f_stddev", **base, initializer=fr.initializers.Hashed(seed=0, stddev=0.1)),
        fr.Feature("f_hashed_default", **base, initializer=fr.initializers.Hashed(seed=0, stddev=0.05)),
        fr.Feature("f_const", **base, initializer=fr.initializers.Constant(0.5)),
        fr.Feature("f_const2", **base, initializer=fr.initializers.Constant(0.5)),
        fr.Feature("f_const_other", **base, initializer=fr.initializers.Constant(0.25)),
        fr.Feature("f_dim", dim=5),
    ]
    groups = groups_of(features)
    assert [names for names, *_ in groups] == [
        ("f_const", "f_const2"),
        ("f_const_other",),
        ("f_default", "f_default_by_dict", "f_default_by_name", "f_hashed_default"),
        ("f_dim",),
        ("f_lr",),
        ("f_seed",),
        ("f_sgd", "f_sgd2"),
        ("f_stddev",),
    ]


def test_layer_defaults_resolve_before_grouping():
    features = [fr.Feature("a", 4), fr.Feature("b", 4, optimizer="sgd")]
    # With the layer default "sgd", the feature naming "sgd" joins the default group.
    assert groups_of(features, optimizer="sgd") == [(("a", "b"), 4, "sgd", "hashed")]
    assert groups_of(features, optimizer="adagrad") == [
        (("a",), 4, "adagrad", "hashed"), (("b",), 4, "sgd", "hashed")]
    init = fr.initializers.Hashed(seed=9)
    features = [fr.Feature("a", 4), fr.Feature("b", 4, initializer=fr.initializers.Hashed(seed=9))]
    assert [g[0] for g in groups_of(features, initializer=init)] == [("a", "b")]
    assert [g[0] for g in groups_of(features)] == [("a",), ("b",)]


# --------------------------------------------------------------------------------------------------------------
# Encodings
# --------------------------------------------------------------------------------------------------------------

def test_packed_encoding_when_every_feature_declares_max_id_bits():
    features = [
        fr.Feature("p1", 4, max_id_bits=20), fr.Feature("p2", 4, max_id_bits=12, key_dtype=tf.int32),
        fr.Feature("h1", 8, max_id_bits=20), fr.Feature("h2", 8),
    ]
    layer = fr.FusedEmbedding(features)
    by_name = {g.feature_names: g for g in layer.groups}
    packed = by_name[("p1", "p2")]
    assert packed.encoding == "packed" and packed.max_id_bits == 20
    hashed = by_name[("h1", "h2")]
    assert hashed.encoding == "hashed" and hashed.max_id_bits is None


@pytest.mark.parametrize("num_features, bits, encoding", [
    (1, 62, "packed"),  # b = 1: keys < 2**62
    (2, 62, "packed"),
    (3, 62, "hashed"),  # b = 2: keys < 2**61 only
    (3, 61, "packed"),
    (5, 60, "packed"),  # b = 3
    (5, 61, "hashed"),
    (1, 63, "hashed"),
])
def test_packed_encoding_needs_room_for_the_category_bits(num_features, bits, encoding):
    features = [fr.Feature(f"f{i}", 4, max_id_bits=bits) for i in range(num_features)]
    groups, _ = cfg.group_features(features, cfg.optimizer_spec("adagrad"), fr.initializers.Hashed())
    assert len(groups) == 1
    assert groups[0].encoding == encoding
    assert groups[0].max_id_bits == (bits if encoding == "packed" else None)


def test_spec_group_is_hashable_and_spec_printable():
    groups, inits = cfg.group_features([fr.Feature("a", 4), fr.Feature("b", 4)], cfg.optimizer_spec("sgd"),
                                       fr.initializers.Hashed())
    assert len({groups[0], groups[0]}) == 1
    assert "dim=4" in str(groups[0].spec) and "sgd" in str(groups[0].spec)
    assert inits == {"a": fr.initializers.Hashed(), "b": fr.initializers.Hashed()}
