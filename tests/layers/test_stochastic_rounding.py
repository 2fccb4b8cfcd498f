"""Stochastic rounding of float16 table rows (FusedEmbedding(storage="float16", rounding="stochastic"),
tf_fusedrec/distributed/rounding.py) on one worker.

* the TF ops (the TFRA backend's commit) equal the NumPy reference (tf_fusedrec.ops.reference.stochastic_float16,
  written on values, not bits) bit for bit, eager and in tf.function: zeros, float16 and float32 subnormals, values
  past 65504, infinities and NaN, each with both signs; so do the random bits (the native kernel's equality with the
  same reference is tests/ops/test_native_table.py);
* unbiased: over 4096 update counts the mean of the rounded value is the value, within 5 standard deviations of a
  mean of 4096 draws, for normals, subnormals and negative values (deterministic bits: the test cannot flake), where
  round to nearest misses it by up to half a float16 step;
* small updates: 400 SGD steps of a quarter float16 step leave a row unchanged when rounded to nearest and move it
  by their sum (within 5 standard deviations) when rounded stochastically, on both backends;
* SGD training of both backends against the NumPy reference, eager and tf.function: every step's outputs and every
  row after training, bit for bit (the random bits are those of (salt, key, the update count, column));
* rounding is a layer argument checked in __init__, round-trips through get_config, and a config key
  (embedding.table_rounding).
The 2-worker runs are tests/distributed/test_horovod.py::test_float16_stochastic_two_workers_equal_one_worker.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec import config as cfg
from tf_fusedrec import initializers
from tf_fusedrec.distributed import rounding
from tf_fusedrec.distributed.table import EmbeddingTable
from tf_fusedrec.ops import reference

from tests.layers.test_half_storage import train_sgd_against_numpy
from tests.ops.test_native_table import rounding_values


def round16(x):
    with np.errstate(over="ignore"):  # past 65519: inf
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def float16_step(x):
    """The float16 step at |x| (float16's normal range and below)."""
    exponent = np.floor(np.log2(np.maximum(np.abs(x), 2.0**-14)))
    return 2.0 ** (exponent - 10)


# --- the TF ops against the reference -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["eager", "function"])
def test_tf_rounding_equals_the_reference(mode):
    rng = np.random.default_rng(5)
    dim = 5
    values = np.concatenate([[np.nan, -np.nan], rounding_values(rng)]).astype(np.float32)
    values = values[: values.size // dim * dim].reshape(-1, dim)
    keys = rng.integers(-(2**63), 2**63 - 1, values.shape[0], dtype=np.int64)
    salt = initializers.feature_salt(3, "items")
    policy = rounding.StochasticRounding(salt)
    fn = policy.to_float16 if mode == "eager" else tf.function(policy.to_float16, autograph=False)
    for count in (1, 7, 2**33 + 5):
        got = fn(tf.constant(values), tf.constant(keys), tf.constant(count, tf.int64)).numpy()
        bits = reference.float16_rounding_bits(salt, keys, count, dim)
        np.testing.assert_array_equal(policy.random_bits(keys, count, dim).numpy(), bits.astype(np.int64))
        want = reference.stochastic_float16(values, bits)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16), err_msg=f"update count {count}")
    # Exactly representable values are kept; everything else goes to a float16 neighbour, with its sign.
    exact = round16(values[np.isfinite(values)])
    kept = rounding.stochastic_float16(tf.constant(exact), tf.constant(np.full(exact.shape, 2**32 - 1, np.int64)))
    np.testing.assert_array_equal(kept.numpy().view(np.uint16), exact.astype(np.float16).view(np.uint16))
    # (Below 2^-33 the bits under 2^-56 are dropped: there even the largest r may round down.)
    finite = np.isfinite(values) & (np.abs(values) < 65504)
    low = reference.stochastic_float16(values, np.zeros(values.shape, np.uint32)).astype(np.float64)
    high = reference.stochastic_float16(values, np.full(values.shape, 2**32 - 1, np.uint32)).astype(np.float64)
    v = values.astype(np.float64)
    assert (np.abs(low[finite]) <= np.abs(v[finite])).all()
    resolved = finite & (np.abs(values) >= 2.0**-33)
    assert (np.abs(high[resolved]) >= np.abs(v[resolved])).all()
    assert (np.abs(high[finite] - low[finite]) <= float16_step(values)[finite]).all()
    assert (np.signbit(low) == np.signbit(values))[~np.isnan(values)].all()


def test_special_values():
    """Zero keeps its sign, past 65504 is inf (with the probability of the step above), NaN is the quiet NaN."""
    values = np.array([0.0, -0.0, 65505.0, -65535.0, 65536.0, np.inf, -np.inf, np.nan, -np.nan], np.float32)
    for r in (0, 2**31, 2**32 - 1):
        got = reference.stochastic_float16(values, np.full(values.shape, r, np.uint32)).view(np.uint16)
        want = [0x0000, 0x8000, 0x7BFF if r < 2**32 - 1 else 0x7C00, 0xFBFF if r < 2**32 - 1 else 0xFC00, 0x7C00,
                0x7C00, 0xFC00, 0x7E00, 0xFE00]
        if r == 2**31:  # 65535 is 31/32 of the way to 65536: up with probability 31/32
            want[3] = 0xFC00
        assert got.tolist() == want, (r, [hex(g) for g in got])


# --- unbiased -----------------------------------------------------------------------------------------------------

def test_mean_over_update_counts_is_the_value():
    """One key rounded at update counts 1..4096: each column's mean is its value within 5 standard deviations of the
    mean of 4096 draws (s sqrt(p (1 - p) / n), s the float16 step, p the fraction of it above the value below); the
    bits are a fixed function of (salt, key, count, column), so this holds or fails the same way on every run.
    Round to nearest, the reference, is off by up to half a step."""
    n = 4096
    values = np.array([1.0 + 2.0**-12, 1.0 + 3 * 2.0**-13, -0.3, 0.1, 1 / 3, 1.3 * 2.0**-20, -3 * 2.0**-26, 1e-5, 7.1,
                       -1000.3, 2.0**-14 - 2.0**-25, 40000.7], np.float32)
    policy = rounding.StochasticRounding(initializers.feature_salt(0, "items"))
    rows = tf.constant(np.tile(values, (n, 1)))
    keys = tf.fill([n], tf.constant(123456789, tf.int64))
    got = policy.to_float16(rows, keys, tf.range(1, n + 1, dtype=tf.int64)).numpy().astype(np.float64)
    step = float16_step(values)
    below = np.trunc(values.astype(np.float64) / step) * step
    p = np.abs(values - below) / step
    sigma = step * np.sqrt(p * (1 - p) / n)
    error = np.abs(got.mean(axis=0) - values)
    assert (error <= 5 * sigma + 1e-12).all(), list(zip(values, error / np.maximum(sigma, 1e-30)))
    assert (np.abs(round16(values) - values) > 10 * sigma).sum() >= 8, "the values round to nearest without bias"
    assert all(len(np.unique(got[:, d])) == 2 for d in range(values.size)), "a value always rounded the same way"


def small_updates(apply, steps=400):
    """A row of 1.0 after `steps` SGD updates of +2^-12 (a quarter float16 step at 1), each rounded by apply(row,
    update count) -> float16 row."""
    row = np.ones(4, np.float32)
    for count in range(1, steps + 1):
        row = np.asarray(apply(row + np.float32(2.0**-12), count), np.float32)
    return row


@pytest.mark.parametrize("backend", ["tfra", "native"])
def test_small_updates_add_up_only_with_stochastic_rounding(fro, backend):
    steps, step = 400, 2.0**-10
    keys = np.array([77], np.int64)
    if backend == "native":
        def table(mode):
            t = fro.NativeTableResource(f"small_{mode}", 4, storage="float16", rounding=mode, salts=[5])
            fro.native_table_upsert(t, keys, np.ones((1, 4), np.float32))

            def apply(row, count):
                fro.native_table_apply_sparse(t, keys, np.full((1, 4), -(2.0**-12), np.float32), [0], keys, 1.0,
                                              update_count=count)
                return fro.native_table_find(t, keys).values.numpy()[0]
            return apply
        nearest, stochastic = small_updates(table("nearest"), steps), small_updates(table("stochastic"), steps)
    else:
        policy = rounding.StochasticRounding(5)
        nearest = small_updates(lambda row, count: round16(row), steps)
        stochastic = small_updates(lambda row, count: policy.to_float16(row[None], keys, count).numpy()[0], steps)
    np.testing.assert_array_equal(nearest, np.ones(4, np.float32))
    # Each rounding adds a zero-mean error of at most one step: the sum of 400 has sd <= 10 steps / 2.
    assert (np.abs(stochastic - (1.0 + steps * 2.0**-12)) <= 5 * 10 * step / 2).all(), stochastic
    assert (stochastic > 1.05).all()


# --- training against NumPy ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["tfra", "native"])
@pytest.mark.parametrize("mode", ["function", "eager"])
def test_sgd_equals_numpy_reference(backend, mode):
    """test_half_storage's SGD harness (train_sgd_against_numpy) with stochastic rounding: the stored row is
    stochastic_float16(row - lr grad) with the bits of (the group's first salt, the row's key, the step's 1-based
    update count, column). A new key's initial row: float32 until its first update (TFRA), rounded to nearest when
    inserted (native)."""
    moved = 0

    def key(layer, f, i):
        group = layer.groups[0]
        keys = fr.ops.category_unique(np.array([i], np.int64), np.array([group.categories.index(f)], np.int32),
                                      group.num_categories, group.encoding).unified_keys
        return int(keys.numpy()[0])

    def stored_update(layer, f, i, s, w):
        nonlocal moved
        group = layer.groups[0]
        salt = initializers.feature_salt(0, group.categories[0])  # the group's first salt (the harness's seed 0)
        bits = reference.float16_rounding_bits(salt, [key(layer, f, i)], s + 1, w.shape[0])
        stored = reference.stochastic_float16(w, bits[0]).astype(np.float32)
        moved += int((stored != round16(w)).sum())
        return stored

    train_sgd_against_numpy(mode, round16 if backend == "native" else (lambda initial: initial), stored_update,
                            rounding="stochastic", table_backend=backend, name=f"sgd16s_{backend}")
    assert moved > 20, "stochastic rounding rounded like nearest"


# --- the argument and the config key ------------------------------------------------------------------------------

def test_rounding_argument():
    with pytest.raises(ValueError, match="bad_rounding: rounding must be one of \\('nearest', 'stochastic'\\)"):
        fr.FusedEmbedding([fr.Feature("a", dim=4)], storage="float16", rounding="up", name="bad_rounding")
    layer = fr.FusedEmbedding([fr.Feature("a", dim=4)], storage="float16", rounding="stochastic", name="sr_cfg")
    assert layer.get_config()["rounding"] == "stochastic"
    assert layer.tables[0].resource.rounding == "stochastic"
    with tf.compat.v1.variable_scope("clone"):
        assert fr.FusedEmbedding.from_config(layer.get_config()).rounding == "stochastic"
    # float32 rows are never rounded: the argument is accepted (a config's default) and changes nothing.
    plain = fr.FusedEmbedding([fr.Feature("a", dim=4)], rounding="stochastic", name="sr_plain")
    assert plain.tables[0].resource.rounding == "nearest"
    with pytest.raises(ValueError, match="table t: rounding stochastic needs storage float16"):
        EmbeddingTable("t", 4, initializers.Hashed(), [0], storage="float32", rounding="stochastic")


def test_config_key():
    raw = {"features": [{"name": "a", "dim": 4, "vocab": 10}], "embedding": {"table_rounding": "stochastic"}}
    assert cfg.parse_config(raw).embedding.table_rounding == "stochastic"
    assert cfg.parse_config({"features": raw["features"]}).embedding.table_rounding == "nearest"
    raw["embedding"]["table_rounding"] = "even"
    with pytest.raises(ValueError, match="config.embedding.table_rounding: must be one of .*got 'even'"):
        cfg.parse_config(raw)
