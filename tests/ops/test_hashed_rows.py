"""tf_fusedrec.ops.hashed_rows (FusedRec>HashedRows) against the NumPy reference hashing.hashed_rows_numpy.

Bit for bit (the kernel and the reference do the same float64 arithmetic and cast last), on random and extreme ids
and salts, dims 1 to 33, empty inputs and a batch large enough to be split over the CPU pool; eagerly, in a
tf.function of unknown lengths and one of static shapes. Also: no gradient flows, the rows are the native table's
initial rows, and bad inputs fail naming what is wrong.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_fusedrec import ops
from tf_fusedrec.hashing import hashed_rows_numpy
from tf_fusedrec.initializers import feature_salt

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def cases():
    rng = np.random.default_rng(5)
    extreme = np.array([0, 1, -1, INT64_MAX, INT64_MIN, 2**31 - 1, -(2**31), 2**32], np.int64)
    yield extreme, np.zeros(extreme.size, np.int64)
    yield extreme, extreme[::-1].copy()
    for n in (1, 7, 300):
        yield (rng.integers(INT64_MIN, INT64_MAX, n, dtype=np.int64, endpoint=True),
               rng.integers(INT64_MIN, INT64_MAX, n, dtype=np.int64, endpoint=True))
    ids = np.arange(50, dtype=np.int64)  # repeated salt: one feature's ids
    yield ids, np.full(ids.size, feature_salt(3, "user_id"), np.int64)


@pytest.mark.parametrize("dim", [1, 4, 16, 33])
@pytest.mark.parametrize("stddev", [0.05, 1.7])
def test_equals_numpy_bit_for_bit(run_all, dim, stddev):
    for ids, salts in cases():
        got = run_all(lambda i, s: ops.hashed_rows(i, s, dim, stddev), ids, salts)  # noqa: B023
        assert got.dtype == np.float32 and got.shape == (ids.size, dim)
        np.testing.assert_array_equal(got, hashed_rows_numpy(ids, salts, dim, stddev), err_msg=f"{ids[:3]}")


def test_empty(run):
    got = run(lambda i, s: ops.hashed_rows(i, s, 5, 0.05), np.zeros([0], np.int64), np.zeros([0], np.int64))
    assert got.shape == (0, 5) and got.dtype == np.float32


def test_large_batch_split_over_threads_equals_numpy():
    rng = np.random.default_rng(9)
    ids = rng.integers(INT64_MIN, INT64_MAX, 50_000, dtype=np.int64)
    salts = rng.integers(INT64_MIN, INT64_MAX, ids.size, dtype=np.int64)
    np.testing.assert_array_equal(ops.hashed_rows(ids, salts, 3, 0.05).numpy(), hashed_rows_numpy(ids, salts, 3, 0.05))


def test_static_shape_and_no_gradient():
    ids, salts = tf.constant([4, 9], tf.int64), tf.constant([1, 2], tf.int64)

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.int64)] * 2)
    def shape_of(i, s):
        rows = ops.hashed_rows(i, s, 6, 0.05)
        assert rows.shape.as_list() == [None, 6]
        return rows

    shape_of(ids, salts)
    assert ops.hashed_rows(ids, salts, 6, 0.05).shape == (2, 6)
    scale = tf.Variable(2.0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(scale * ops.hashed_rows(ids, salts, 6, 0.05))
    # The rows are a constant of (id, salt): the gradient reaches the scale, nothing flows into the op.
    np.testing.assert_allclose(tape.gradient(loss, scale).numpy(), hashed_rows_numpy([4, 9], [1, 2], 6, 0.05).sum(),
                               rtol=1e-5)


def test_equals_the_native_tables_initial_rows():
    salts = [feature_salt(0, "a"), feature_salt(0, "b")]
    table = ops.NativeTableResource("hashed_rows_twin", dim=8, optimizer="sgd", init="hashed", stddev=0.05,
                                    salts=salts)
    ids = np.array([0, 3, INT64_MAX, -5], np.int64)
    categories = np.array([0, 1, 1, 0], np.int32)
    rows = ops.native_table_lookup_or_init(table, ids, categories, ids)
    want = ops.hashed_rows(ids, np.asarray(salts, np.int64)[categories], 8, 0.05)
    np.testing.assert_array_equal(rows.numpy(), want.numpy())


def test_bad_inputs_name_the_problem(run_all):
    with pytest.raises(ValueError, match="dim must be >= 1"):
        ops.hashed_rows([1], [1], 0, 0.05)
    with pytest.raises(ValueError, match="stddev must be > 0"):
        ops.hashed_rows([1], [1], 2, 0.0)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="same length|Dimensions must be equal"):
        run_all(lambda i, s: ops.hashed_rows(i, s, 2, 0.05), np.arange(3, dtype=np.int64), np.arange(2, dtype=np.int64))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="must be a vector|must be rank 1"):
        run_all(lambda i, s: ops.hashed_rows(i, s, 2, 0.05), np.zeros([2, 2], np.int64), np.zeros([2, 2], np.int64))
