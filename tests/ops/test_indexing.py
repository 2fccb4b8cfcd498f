"""tf_fusedrec.ops.indexing (row ids by a sorted search) against NumPy's repeat.

rows_of(splits) must equal np.repeat(arange(B), lengths) and rows_of(splits, positions) that array at the positions;
repeat(values, counts) must equal np.repeat(values, counts). Random lengths, empty rows first, last and in runs,
all-empty and zero-row batches, in both index dtypes, eagerly and in a tf.function of unknown lengths.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_fusedrec.ops import indexing

DTYPES = [np.int32, np.int64]


def length_cases():
    rng = np.random.default_rng(7)
    cases = [[], [0], [0, 0, 0], [3], [0, 2, 0, 0, 1, 0], [1] * 9, [0, 0, 5]]
    cases += [list(rng.integers(0, 6, size=int(rng.integers(1, 40)))) for _ in range(20)]
    cases.append(list(rng.integers(0, 50, size=2000)))
    return cases


def splits_of(lengths, dtype):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_of_every_position_equals_numpy(run, dtype):
    for lengths in length_cases():
        got = run(indexing.rows_of, splits_of(lengths, dtype))
        assert got.dtype == dtype, lengths
        np.testing.assert_array_equal(got, np.repeat(np.arange(len(lengths)), lengths), err_msg=str(lengths))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("positions_dtype", DTYPES)
def test_rows_of_some_positions_equals_numpy(run, dtype, positions_dtype):
    rng = np.random.default_rng(11)
    for lengths in length_cases():
        rows = np.repeat(np.arange(len(lengths)), lengths)
        positions = np.sort(rng.choice(len(rows), size=len(rows) // 2, replace=False)) if len(rows) else []
        positions = np.asarray(positions, positions_dtype)
        got = run(indexing.rows_of, splits_of(lengths, dtype), positions)
        assert got.dtype == dtype, lengths
        np.testing.assert_array_equal(got, rows[positions], err_msg=str(lengths))


def test_rows_of_matches_ragged_value_rowids():
    for lengths in length_cases():
        ragged = tf.RaggedTensor.from_row_lengths(tf.zeros([int(np.sum(lengths))]), tf.constant(lengths, tf.int64))
        np.testing.assert_array_equal(indexing.rows_of(ragged.row_splits).numpy(), ragged.value_rowids().numpy())


@pytest.mark.parametrize("dtype", DTYPES)
def test_repeat_equals_numpy(run, dtype):
    rng = np.random.default_rng(3)
    for counts in length_cases():
        counts = np.asarray(counts, dtype)
        values = rng.integers(-100, 100, size=len(counts)).astype(np.int32)
        got = run(indexing.repeat, values, counts)
        np.testing.assert_array_equal(got, np.repeat(values, counts), err_msg=str(counts))


def mask_cases():
    rng = np.random.default_rng(13)
    cases = [[], [True], [False], [True] * 5, [False] * 5, [True, False, True, True, False]]
    return cases + [list(rng.random(int(rng.integers(1, 60))) < p) for p in (0.1, 0.5, 0.9) for _ in range(4)]


def test_true_positions_equals_numpy(run):
    for mask in mask_cases():
        got = run(indexing.true_positions, np.asarray(mask, bool).reshape(-1))
        assert got.dtype == np.int64, mask
        np.testing.assert_array_equal(got, np.flatnonzero(mask), err_msg=str(mask))


def test_masked_equals_boolean_mask(run):
    rng = np.random.default_rng(17)
    for mask in mask_cases():
        mask = np.asarray(mask, bool).reshape(-1)
        keys = rng.integers(-9, 9, mask.size).astype(np.int64)
        rows = rng.random((mask.size, 3)).astype(np.float32)
        got_keys, got_rows = run(lambda m, k, r: indexing.masked(m, k, r), mask, keys, rows)
        np.testing.assert_array_equal(got_keys, keys[mask])
        np.testing.assert_array_equal(got_rows, rows[mask])
        assert run(lambda m, k: indexing.masked(m, k), mask, keys).shape == (int(mask.sum()),)
    assert indexing.masked(tf.constant([True, False]), tf.constant([1, 2]), None)[1] is None


def test_masked_gradient_equals_boolean_masks():
    mask = tf.constant([True, False, True, True])
    x = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3))
    weights = tf.constant(np.arange(9, dtype=np.float32).reshape(3, 3))
    grads = []
    for select in (lambda: indexing.masked(mask, x), lambda: tf.boolean_mask(x, mask)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(select() * weights)
        grads.append(tf.convert_to_tensor(tape.gradient(loss, x)).numpy())
    np.testing.assert_array_equal(grads[0], grads[1])
