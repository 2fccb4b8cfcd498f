"""Tests of fro.valid_ids and fro.id_extremes (the layer's input preparation over all features, one op each) against
NumPy (reference.valid_ids / id_extremes) and against the TensorFlow chains they replaced in _inputs.flatten_feature
and id_violations (Where of ids >= 0 and a gather; a Min and a Max per feature): no padding, all padding, empty
features first, last and only, vectors, [B, L] and higher ranks, int64's extremes, eagerly and in a tf.function of
unknown and of static shapes; bad arguments are clear errors.
"""

import numpy as np
import pytest
import tensorflow as tf

EXTREMES = np.array([0, 1, -1, 2 ** 63 - 1, -(2 ** 63), 2 ** 40, -2], np.int64)


def chain_valid(ids):
    """The per-feature chain valid_ids replaced (_inputs.flatten_feature before it)."""
    valid, positions = [], []
    for x in ids:
        flat = tf.reshape(x, [-1])
        p = tf.reshape(tf.where(flat >= 0), [-1])
        valid.append(tf.gather(flat, p))
        positions.append(p)
    return valid, positions


def chain_extremes(ids):
    """The per-feature reductions id_extremes replaced (_inputs.id_violations before it)."""
    return tf.stack([tf.reduce_min(x) for x in ids]), tf.stack([tf.reduce_max(x) for x in ids])


def cases():
    """Lists of shapes with the share of -1 padding: the ids of N features."""
    rng = np.random.default_rng(3)
    out = [([(5,)], 0.0), ([(0,)], 0.0), ([(4,)], 1.0), ([(0,), (3,), (0,)], 0.3), ([(6, 3), (2,), (0, 4)], 0.4),
           ([(2, 3, 2)], 0.5), ([(7,)] * 3, 0.0)]
    for _ in range(6):
        n = int(rng.integers(1, 28))
        shapes = [(int(rng.integers(0, 300)),) if rng.random() < 0.7 else
                  (int(rng.integers(0, 60)), int(rng.integers(1, 6))) for _ in range(n)]
        out.append((shapes, float(rng.choice([0.0, 0.1, 0.6]))))
    return out


def make_ids(shapes, padding, seed):
    rng = np.random.default_rng(seed)
    ids = []
    for shape in shapes:
        x = rng.integers(0, 2 ** 62, shape).astype(np.int64)
        x[rng.random(shape) < padding] = -1
        ids.append(x)
    if ids[0].size:  # int64's extremes, 0, +-1 and -2 among the first feature's ids
        flat = ids[0].reshape(-1)
        k = min(flat.size, EXTREMES.size)
        flat[:k] = EXTREMES[:k]
    return ids


@pytest.mark.parametrize("shapes, padding", cases())
def test_valid_ids_equal_numpy_and_the_chain(fro, ref, run, shapes, padding):
    ids = make_ids(shapes, padding, len(shapes) + int(padding * 10))
    want_valid, want_positions = ref.valid_ids(ids)
    got_valid, got_positions = run(lambda *x: tuple(map(tuple, fro.valid_ids(list(x)))), *ids)
    chain_v, chain_p = run(lambda *x: tuple(map(tuple, chain_valid(list(x)))), *ids)
    for g, w, c in zip(got_valid + got_positions, want_valid + want_positions, chain_v + chain_p):
        assert g.dtype == np.int64 and g.ndim == 1
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(g, c)


@pytest.mark.parametrize("shapes, padding", cases())
def test_id_extremes_equal_numpy_and_the_chain(fro, ref, run, shapes, padding):
    ids = make_ids(shapes, padding, len(shapes) + 1)
    got = run(lambda *x: fro.id_extremes(list(x)), *ids)
    for g, w, c in zip(got, ref.id_extremes(ids), run(lambda *x: chain_extremes(list(x)), *ids)):
        assert g.dtype == np.int64 and g.shape == (len(ids),)
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(g, c)


def test_an_empty_feature_has_the_reductions_identities(fro):
    lows, highs = fro.id_extremes([tf.zeros([0], tf.int64), tf.constant([[3, -1]], tf.int64)])
    np.testing.assert_array_equal(lows.numpy(), [2 ** 63 - 1, -1])
    np.testing.assert_array_equal(highs.numpy(), [-(2 ** 63), 3])


def test_static_shapes(fro):
    @tf.function(input_signature=[tf.TensorSpec([4], tf.int64), tf.TensorSpec([None, 2], tf.int64)])
    def fn(a, b):
        valid, positions = fro.valid_ids([a, b])
        lows, highs = fro.id_extremes([a, b])
        for t in valid + positions:
            assert t.shape.as_list() == [None], t.shape
        assert lows.shape.as_list() == [2] and highs.shape.as_list() == [2]
        return valid, positions

    valid, positions = fn(tf.constant([5, -1, 7, 0], tf.int64), tf.constant([[-1, 2], [3, -1]], tf.int64))
    np.testing.assert_array_equal(valid[0].numpy(), [5, 7, 0])
    np.testing.assert_array_equal(positions[0].numpy(), [0, 2, 3])
    np.testing.assert_array_equal(valid[1].numpy(), [2, 3])
    np.testing.assert_array_equal(positions[1].numpy(), [1, 2])


@pytest.mark.parametrize("op", ["valid_ids", "id_extremes"])
def test_errors(fro, op):
    fn = getattr(fro, op)
    with pytest.raises(ValueError, match="at least one ids tensor"):
        fn([])
    with pytest.raises(TypeError, match=r"ids\[1\] must be int64, got int32"):
        fn([tf.constant([1], tf.int64), tf.constant([1], tf.int32)])
