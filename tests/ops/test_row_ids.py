"""Tests of fro.row_ids (a ragged layout's row of each flat position, one pass for ordered positions) against NumPy's
searchsorted, the reference's position loop (small cases) and indexing.rows_of (TensorFlow's UpperBound), which it replaces in the layer's input
preparation: sorted, unsorted, repeated, negative and past-the-end positions, empty rows first, last and in runs,
no rows, both dtypes, eagerly and in a tf.function of unknown lengths; bad arguments are clear errors.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_fusedrec.ops import indexing

DTYPES = [np.int32, np.int64]


def numpy_rows(splits, positions):
    ends = np.asarray(splits)[1:]
    return np.searchsorted(ends, positions, side="right").astype(np.asarray(splits).dtype)


def cases():
    """(lengths, positions kind)."""
    rng = np.random.default_rng(5)
    lengths = [[], [0], [0, 0, 0], [3], [0, 2, 0, 0, 1, 0], [1] * 9, [0, 0, 5], [40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]]
    lengths += [list(rng.integers(0, 6, size=int(rng.integers(1, 40)))) for _ in range(12)]
    lengths += [list(rng.integers(0, 50, size=2000)), list(rng.integers(0, 3, size=5000))]
    return [(lg, kind) for lg in lengths for kind in ("all", "sorted", "unsorted", "repeated", "outside")]


def positions_of(total, kind, rng):
    if kind == "all":
        return np.arange(total)
    if kind == "sorted":
        return np.sort(rng.choice(total, size=total // 2, replace=False)) if total else np.zeros(0, int)
    if kind == "unsorted":
        return rng.permutation(total)[: max(1, total // 2)] if total else np.zeros(0, int)
    if kind == "repeated":  # runs of one position, ordered
        return np.sort(rng.integers(0, max(total, 1), size=3 * total + 2))
    # outside: negative and past-the-end positions among ordered ones and out of order
    return np.concatenate([[-5, -1], np.arange(total), [total, total + 7, 0, -3, total // 2]])


@pytest.mark.parametrize("dtype", DTYPES)
def test_equals_numpy_and_the_reference(fro, ref, run, dtype):
    rng = np.random.default_rng(11)
    for lengths, kind in cases():
        splits = np.concatenate([[0], np.cumsum(lengths)]).astype(dtype)
        positions = positions_of(int(splits[-1]), kind, rng).astype(dtype)
        got = run(fro.row_ids, splits, positions)
        assert got.dtype == dtype and got.shape == positions.shape, (lengths, kind)
        want = numpy_rows(splits, positions)
        np.testing.assert_array_equal(got, want, err_msg=f"{lengths} {kind}")
        np.testing.assert_array_equal(got, run(indexing.rows_of, splits, positions), err_msg=f"{lengths} {kind}")
        if len(lengths) < 100:
            np.testing.assert_array_equal(got, ref.row_ids(splits, positions), err_msg=f"{lengths} {kind}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_position_is_value_rowids(fro, dtype):
    for lengths, kind in cases():
        if kind != "all":
            continue
        ragged = tf.RaggedTensor.from_row_lengths(tf.zeros([int(np.sum(lengths))]), tf.constant(lengths, tf.int64))
        splits = tf.cast(ragged.row_splits, dtype)
        np.testing.assert_array_equal(fro.row_ids(splits).numpy(), ragged.value_rowids().numpy())


def test_positions_of_another_dtype_and_no_splits(fro):
    splits = tf.constant([0, 2, 2, 5], tf.int32)
    got = fro.row_ids(splits, tf.constant([0, 1, 2, 4, 5], tf.int64))
    assert got.dtype == tf.int32
    np.testing.assert_array_equal(got.numpy(), [0, 0, 2, 2, 3])
    # No row at all: every position is past the (absent) ends, as UpperBound over an empty list says.
    np.testing.assert_array_equal(fro.row_ids(tf.constant([0], tf.int64), tf.constant([0, 3], tf.int64)).numpy(),
                                  [0, 0])


def test_static_shape(fro):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64)])
    def fn(splits, positions):
        out = fro.row_ids(splits, positions)
        assert out.shape.as_list() == [None], out.shape
        return out

    assert fn(tf.constant([0, 1], tf.int64), tf.constant([0, 0, 0], tf.int64)).shape == (3,)


def test_repeat_equals_numpy(fro, run):
    """indexing.repeat with row_ids=fro.row_ids, as the layer's fuse calls it."""
    rng = np.random.default_rng(3)
    for lengths, kind in cases():
        if kind != "all":
            continue
        counts = np.asarray(lengths, np.int32)
        values = rng.integers(-100, 100, size=len(counts)).astype(np.int32)
        np.testing.assert_array_equal(run(lambda v, c: indexing.repeat(v, c, row_ids=fro.row_ids), values, counts),
                                      np.repeat(values, counts))


def test_errors(fro, run_all, check):
    with pytest.raises(TypeError, match="row_splits must be int32 or int64, got float32"):
        fro.row_ids(tf.constant([0.0, 1.0]), tf.constant([0]))
    with pytest.raises(TypeError, match="positions must be int32 or int64, got float32"):
        fro.row_ids(tf.constant([0, 1]), tf.constant([0.5]))
    check.expect_error(lambda: run_all(fro.row_ids, np.zeros((2, 2), np.int64), np.zeros(3, np.int64)),
                       r"row_splits must be a vector|must be rank 1")
    check.expect_error(lambda: run_all(fro.row_ids, np.zeros(2, np.int64), np.zeros((3, 1), np.int64)),
                       r"positions must be a vector|must be rank 1")


@pytest.mark.parametrize("threads", [1, 0])
def test_session_mode_large(fro, session_run, threads):
    """A v1 session of unknown lengths, a large ragged layout (a worker's multi-hot feature), sorted positions."""
    rng = np.random.default_rng(23)
    lengths = rng.integers(0, 30, size=4096)
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    positions = np.sort(rng.choice(int(splits[-1]), size=int(splits[-1]) * 3 // 4, replace=False)).astype(np.int64)
    got = session_run(fro.row_ids, splits, positions, intra_op_threads=threads)
    np.testing.assert_array_equal(got, numpy_rows(splits, positions))


def test_no_gradient(fro):
    splits = tf.constant([0, 2, 5], tf.int64)
    positions = tf.Variable([0, 3], dtype=tf.int64)
    with tf.GradientTape() as tape:
        rows = fro.row_ids(splits, positions)
    assert tape.gradient(rows, positions) is None
