"""fr.initializers: Hashed rows, feature salts and mix64 against independent NumPy / pure-Python versions."""

import json

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tests.layers import reference as ref

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def special_ids():
    return np.array([0, 1, 2, -1, INT64_MAX, INT64_MIN, 2**31 - 1, -(2**31), 12345678901234], np.int64)


def test_mix64_matches_numpy_and_python():
    rng = np.random.default_rng(1)
    x = np.concatenate([special_ids(), rng.integers(INT64_MIN, INT64_MAX, 500, dtype=np.int64, endpoint=True)])
    got = fr.initializers.mix64(tf.constant(x)).numpy()
    assert got.dtype == np.int64
    want = ref.mix64(ref.as_u64(x)).view(np.int64)
    np.testing.assert_array_equal(got, want)
    for v, g in zip(x[:20], got[:20]):
        assert ref.to_int64(ref.mix64_int(int(v))) == int(g)


def test_mix64_known_values():
    # splitmix64's finalizer maps 0 to 0; mix64(1) worked out with Python ints.
    got = fr.initializers.mix64(tf.constant([0, 1], tf.int64)).numpy()
    assert got[0] == 0
    assert int(got[1]) == ref.to_int64(ref.mix64_int(1))
    assert int(got[1]) != 1


def test_feature_salt_matches_documented_hash():
    for seed in (0, 1, 7, -3):
        for name in ("user_id", "item_id", "a", "Ü/名"):
            salt = fr.initializers.feature_salt(seed, name)
            assert isinstance(salt, int) and INT64_MIN <= salt <= INT64_MAX
            assert salt == ref.feature_salt(seed, name)
    assert fr.initializers.feature_salt(0, "a") != fr.initializers.feature_salt(0, "b")
    assert fr.initializers.feature_salt(0, "a") != fr.initializers.feature_salt(1, "a")
    # Stable: the same value on every call (and, being a pure hash, in every process).
    assert fr.initializers.feature_salt(0, "user_id") == fr.initializers.feature_salt(0, "user_id")


@pytest.mark.parametrize("dim", [1, 3, 16])
@pytest.mark.parametrize("stddev", [0.05, 1.7])
def test_hashed_rows_match_numpy(dim, stddev):
    rng = np.random.default_rng(dim)
    ids = np.concatenate([special_ids(), rng.integers(INT64_MIN, INT64_MAX, 200, dtype=np.int64)])
    salts = rng.integers(INT64_MIN, INT64_MAX, ids.size, dtype=np.int64)
    salts[:3] = [0, -1, INT64_MAX]
    got = fr.initializers.Hashed(seed=0, stddev=stddev).rows(tf.constant(ids), tf.constant(salts), dim).numpy()
    assert got.dtype == np.float32 and got.shape == (ids.size, dim)
    want = ref.hashed_rows(ids, salts, dim, stddev)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * stddev)


def test_hashed_rows_known_answer_pure_python():
    salt = ref.feature_salt(0, "user_id")
    ids = [0, 5, INT64_MAX, -7]
    got = fr.initializers.Hashed(0, 0.05).rows(tf.constant(ids, tf.int64), tf.constant([salt] * 4, tf.int64), 6)
    for i, key in enumerate(ids):
        np.testing.assert_allclose(got.numpy()[i], ref.hashed_row_scalar(key, salt, 6, 0.05), rtol=1e-6, atol=1e-8)


def test_hashed_rows_float64_and_prefix_property():
    h = fr.initializers.Hashed(3, 0.5)
    ids = tf.constant([4, 9], tf.int64)
    salts = tf.constant([11, 11], tf.int64)
    wide = h.rows(ids, salts, 8, dtype=tf.float64).numpy()
    assert wide.dtype == np.float64
    # Column j depends only on (id, salt, j): a narrower row is a prefix of a wider one.
    np.testing.assert_allclose(h.rows(ids, salts, 3).numpy(), wide[:, :3].astype(np.float32), rtol=1e-6)
    np.testing.assert_allclose(wide, ref.hashed_rows([4, 9], [11, 11], 8, 0.5), rtol=1e-6)


def test_hashed_rows_in_tf_function_and_empty():
    h = fr.initializers.Hashed(0, 0.05)
    fn = tf.function(lambda i, s: h.rows(i, s, 4),
                     input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64)])
    ids = np.array([3, 1, 3], np.int64)
    np.testing.assert_allclose(fn(ids, np.full(3, 5, np.int64)).numpy(), ref.hashed_rows(ids, [5, 5, 5], 4),
                               rtol=1e-6, atol=1e-8)
    empty = fn(np.zeros([0], np.int64), np.zeros([0], np.int64)).numpy()
    assert empty.shape == (0, 4)


def test_hashed_rows_distribution():
    h = fr.initializers.Hashed(0, 0.05)
    ids = np.arange(20000, dtype=np.int64)
    rows = h.rows(tf.constant(ids), tf.fill([ids.size], tf.constant(17, tf.int64)), 4).numpy()
    assert abs(rows.mean()) < 0.002
    assert abs(rows.std() - 0.05) < 0.002
    # Different ids, different salts: different rows.
    assert not np.allclose(rows[0], rows[1])
    other = h.rows(tf.constant(ids[:5]), tf.fill([5], tf.constant(18, tf.int64)), 4).numpy()
    assert not np.allclose(rows[:5], other)


def test_hashed_validation_and_identity():
    with pytest.raises(ValueError, match="seed"):
        fr.initializers.Hashed(seed=1.5)
    with pytest.raises(ValueError, match="stddev"):
        fr.initializers.Hashed(stddev=0.0)
    with pytest.raises(ValueError, match="stddev"):
        fr.initializers.Hashed(stddev=-1.0)
    a, b, c = fr.initializers.Hashed(1, 0.1), fr.initializers.Hashed(1, 0.1), fr.initializers.Hashed(2, 0.1)
    assert a == b and hash(a) == hash(b) and a != c
    assert a != fr.initializers.Hashed(1, 0.2)
    assert a.spec_key() == b.spec_key() != c.spec_key()
    assert a.get_config() == {"seed": 1, "stddev": 0.1}


def test_serialize_round_trip():
    h = fr.initializers.Hashed(5, 0.25)
    config = fr.initializers.serialize(h)
    json.dumps(config)
    back = fr.initializers.deserialize(json.loads(json.dumps(config)))
    assert back == h
    const = fr.initializers.deserialize(fr.initializers.serialize(fr.initializers.Constant(0.5)))
    np.testing.assert_allclose(const([2, 3]).numpy(), np.full([2, 3], 0.5))
    assert fr.initializers.get(None) is None
    assert fr.initializers.get(h) is h
    assert fr.initializers.get(config) == h
    np.testing.assert_array_equal(fr.initializers.get("zeros")([2, 2]).numpy(), np.zeros([2, 2]))


def test_keras_initializer_helpers():
    np.testing.assert_allclose(fr.initializers.Constant(0.3)([2, 2]).numpy(), np.full([2, 2], 0.3), rtol=1e-6)
    np.testing.assert_array_equal(fr.initializers.Zeros()([3]).numpy(), np.zeros([3]))
    rn = fr.initializers.RandomNormal(mean=1.0, stddev=0.01, seed=3)([1000]).numpy()
    assert abs(rn.mean() - 1.0) < 0.01
    # Hashed hands TFRA a placeholder default (the layers insert the rows themselves); others pass through.
    assert fr.initializers.is_hashed(fr.initializers.Hashed())
    assert not fr.initializers.is_hashed(fr.initializers.Zeros())
    const = fr.initializers.Constant(0.3)
    assert fr.initializers.tfra_initializer(const) is const
