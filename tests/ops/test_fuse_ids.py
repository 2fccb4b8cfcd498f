"""Tests of fro.fuse_ids (a group's per-feature ids as one key list with each key's category, in one op) against
NumPy (reference.fuse_ids) and against the TensorFlow chain it replaced in group_lookup.fuse (concat, a size per
feature, stack, indexing.repeat of the categories): empty features first, last and all, one feature, shared
categories (a feature reading another's rows), extreme ids, eagerly, in a tf.function of unknown lengths and with
static ones; bad arguments are clear errors.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_fusedrec.ops import indexing

EXTREMES = np.array([0, 1, -1, 2 ** 63 - 1, -(2 ** 63), 2 ** 40], np.int64)


def chain(ids, categories):
    """The op chain fuse_ids replaced (group_lookup.fuse before it)."""
    keys = tf.concat(ids, axis=0)
    sizes = tf.stack([tf.size(x, out_type=tf.int32) for x in ids])
    return keys, indexing.repeat(tf.constant(categories, tf.int32), sizes), sizes


def cases():
    rng = np.random.default_rng(8)
    out = [([3], [0]), ([0], [0]), ([0, 0, 0], [0, 1, 2]), ([0, 4, 0], [2, 0, 1]), ([5, 0, 2, 0], [0, 1, 1, 3]),
           ([2, 2, 2], [1, 1, 0])]  # the last: categories shared between features
    for _ in range(6):
        n = int(rng.integers(1, 30))
        out.append((list(rng.integers(0, 3000, n)), list(rng.integers(0, 40, n))))
    return out


@pytest.mark.parametrize("sizes, categories", cases())
def test_equals_numpy_and_the_chain(fro, ref, run, sizes, categories):
    rng = np.random.default_rng(sum(sizes) + len(sizes))
    ids = [rng.integers(-(2 ** 62), 2 ** 62, n).astype(np.int64) for n in sizes]
    ids[0] = np.concatenate([EXTREMES, ids[0]])[: sizes[0]]  # int64's extremes and 0, +-1 among the first ids
    want = ref.fuse_ids(ids, categories)
    got = run(lambda *x: fro.fuse_ids(list(x), categories), *ids)
    for g, w, dtype in zip(got, want, (np.int64, np.int32, np.int32)):
        assert g.dtype == dtype
        np.testing.assert_array_equal(g, w)
    for g, c in zip(got, run(lambda *x: chain(list(x), categories), *ids)):
        np.testing.assert_array_equal(g, c)


def test_static_shapes(fro):
    @tf.function(input_signature=[tf.TensorSpec([3], tf.int64), tf.TensorSpec([None], tf.int64)])
    def unknown(a, b):
        keys, segments, sizes = fro.fuse_ids([a, b], [4, 1])
        assert keys.shape.as_list() == [None] and segments.shape.as_list() == [None], keys.shape
        assert sizes.shape.as_list() == [2]
        return keys, segments

    @tf.function(input_signature=[tf.TensorSpec([3], tf.int64), tf.TensorSpec([2], tf.int64)])
    def known(a, b):
        keys, segments, _ = fro.fuse_ids([a, b], [4, 1])
        assert keys.shape.as_list() == [5] and segments.shape.as_list() == [5], keys.shape
        return keys

    keys, segments = unknown(tf.constant([1, 2, 3], tf.int64), tf.constant([9], tf.int64))
    np.testing.assert_array_equal(segments.numpy(), [4, 4, 4, 1])
    np.testing.assert_array_equal(known(tf.constant([1, 2, 3], tf.int64), tf.constant([8, 9], tf.int64)).numpy(),
                                  [1, 2, 3, 8, 9])


def test_errors(fro, run_all, check):
    one = np.array([1, 2], np.int64)
    with pytest.raises(ValueError, match="at least one"):
        fro.fuse_ids([], [])
    with pytest.raises(ValueError, match="one category per ids tensor: 2 tensors, 1 categories"):
        fro.fuse_ids([one, one], [0])
    with pytest.raises(ValueError, match=r"categories\[1\] must be in \[0, 2\^31\), got -1"):
        fro.fuse_ids([one, one], [0, -1])
    with pytest.raises(TypeError, match=r"ids\[1\] must be int64, got int32"):
        fro.fuse_ids([one, one.astype(np.int32)], [0, 1])
    check.expect_error(lambda: run_all(lambda a, b: fro.fuse_ids([a, b], [0, 1]), one, np.ones((2, 2), np.int64)),
                       r"ids\[1\] must be a vector|rank")
    lib = fro.load_ops()
    check.expect_error(lambda: lib.fused_rec_fuse_ids([tf.constant(one)], categories=[0, 1]),
                       r"one category per ids tensor: 1 tensors, 2 categories")
    check.expect_error(lambda: lib.fused_rec_fuse_ids([tf.constant(one)], categories=[2 ** 31]),
                       r"categories\[0\] must be in \[0, 2\^31\)", 2147483648)
