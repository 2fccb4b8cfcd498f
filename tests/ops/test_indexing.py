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
