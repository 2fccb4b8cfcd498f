"""Tests of fro.upper_triangle (DLRM's pairwise interactions) against NumPy and the boolean mask it replaces.

Forward and gradient must equal the boolean mask's exactly (the op only moves values), in every execution mode, for
every dtype the op takes; the gradient is also checked numerically in float64, and bad shapes are clear errors.
"""

import numpy as np
import pytest
import tensorflow as tf

DTYPES = [np.float16, np.float32, np.float64]
SIZES = [(0, 3), (1, 1), (1, 2), (5, 4), (64, 27), (3000, 27)]  # (B, F); 3000 examples run on several tasks


def numpy_upper(x):
    """x [B, F, F] -> [B, F (F - 1) / 2], the pairs i < j row by row, with two loops."""
    b, f, _ = x.shape
    return np.array([[x[k, i, j] for i in range(f) for j in range(i + 1, f)] for k in range(b)],
                    x.dtype).reshape(b, f * (f - 1) // 2)


def mask_upper(x):
    f = x.shape[1]
    upper = tf.constant([[i < j for j in range(f)] for i in range(f)])
    return tf.reshape(tf.boolean_mask(x, tf.broadcast_to(upper, tf.shape(x))), [-1, f * (f - 1) // 2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", SIZES)
def test_equals_numpy(fro, run, check, dtype, size):
    b, f = size
    x = np.random.default_rng(b * 100 + f).normal(size=(b, f, f)).astype(dtype)
    check.assert_same([run(fro.upper_triangle, x)], [numpy_upper(x)])


def test_bfloat16_equals_float32_values(fro, run):
    x = np.random.default_rng(1).normal(size=(7, 5, 5)).astype(np.float32)
    got = run(lambda t: tf.cast(fro.upper_triangle(tf.cast(t, tf.bfloat16)), tf.float32), x)
    np.testing.assert_array_equal(got, numpy_upper(tf.cast(tf.cast(x, tf.bfloat16), tf.float32).numpy()))


@pytest.mark.parametrize("size", [(5, 4), (3000, 27)])
def test_forward_and_gradient_equal_the_boolean_mask(fro, size):
    b, f = size
    rng = np.random.default_rng(7)
    x = tf.constant(rng.normal(size=(b, f, f)).astype(np.float32))
    w = tf.constant(rng.normal(size=(b, f * (f - 1) // 2)).astype(np.float32))
    grads = []
    for fn in (fro.upper_triangle, mask_upper):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = fn(x)
            loss = tf.reduce_sum(out * w)
        grads.append((out.numpy(), tf.convert_to_tensor(tape.gradient(loss, x)).numpy()))
    np.testing.assert_array_equal(grads[0][0], grads[1][0])
    np.testing.assert_array_equal(grads[0][1], grads[1][1])
    # The gradient places w above the diagonals and zeros elsewhere.
    expected = np.zeros((b, f, f), np.float32)
    rows, cols = np.triu_indices(f, 1)
    expected[:, rows, cols] = w.numpy()
    np.testing.assert_array_equal(grads[0][1], expected)


@pytest.mark.parametrize("function", [False, True])
def test_gradient_numerically(fro, function):
    x = tf.constant(np.random.default_rng(3).normal(size=(3, 4, 4)), tf.float64)
    fn = tf.function(fro.upper_triangle) if function else fro.upper_triangle
    theoretical, numerical = tf.test.compute_gradient(fn, [x])
    np.testing.assert_allclose(theoretical[0], numerical[0], atol=1e-6)


def test_second_order(fro):
    """The gradient of the gradient op is the op again."""
    x = tf.constant(np.random.default_rng(4).normal(size=(2, 4, 4)), tf.float64)
    upstream = tf.constant(np.random.default_rng(5).normal(size=(2, 6)), tf.float64)
    w = tf.constant(np.random.default_rng(6).normal(size=(2, 4, 4)), tf.float64)
    with tf.GradientTape() as outer:
        outer.watch(upstream)
        with tf.GradientTape() as inner:
            inner.watch(x)
            y = tf.reduce_sum(fro.upper_triangle(x) * upstream)
        grad = inner.gradient(y, x)
        z = tf.reduce_sum(grad * w)
    np.testing.assert_array_equal(outer.gradient(z, upstream).numpy(), numpy_upper(w.numpy()))


def test_static_shape(fro):
    @tf.function(input_signature=[tf.TensorSpec([None, 5, 5], tf.float32)])
    def fn(x):
        out = fro.upper_triangle(x)
        assert out.shape.as_list() == [None, 10], out.shape
        return out

    assert fn(tf.zeros([2, 5, 5])).shape == (2, 10)


def test_errors(fro, run_all, check):
    check.expect_error(lambda: run_all(fro.upper_triangle, np.zeros((2, 3, 4), np.float32)), r"\[B, F, F\]")
    check.expect_error(lambda: run_all(fro.upper_triangle, np.zeros((2, 3), np.float32)), r"rank|\[B, F, F\]")
    with pytest.raises(TypeError, match="float16, bfloat16, float32 or float64, got int32"):
        fro.upper_triangle(tf.zeros([2, 3, 3], tf.int32))
