"""Tests of fro.dot_interaction (DLRM's pairwise interactions in one op) against NumPy in float64 and against the
batch matmul + upper_triangle it replaces.

The op sums each dot product in its own order (8 floats at a time where the CPU has AVX2 and FMA), so values are
compared to a float64 reference with a float32 tolerance, never bit for bit; the gradient is checked against the
reference's and numerically, in eager and graph mode; bad shapes and dtypes are clear errors.
"""

import numpy as np
import pytest
import tensorflow as tf

# (B, F, D): empty batch, no pair, one pair, D below, at and above the 8-float vectors, D with a tail, F not a
# multiple of 4 (the forward's blocks of four), and 3000 examples (several tasks).
# (B, F, D). The AVX2 gradient works in blocks of R = 8 / N rows of N vectors of 8 columns (N = 4, 2, 1 as D allows),
# the rows left over as one smaller block: D = 8, 16, 24, 32, 40, 45 with F leaving every remainder of its R.
SIZES = [(0, 4, 8), (3, 1, 8), (3, 2, 8), (4, 5, 3), (2, 9, 13), (5, 27, 16), (2, 6, 45), (3, 4, 0), (3000, 27, 16),
         (3, 7, 32), (2, 10, 16), (2, 13, 24), (2, 15, 8), (2, 4, 8), (2, 12, 40), (2, 3, 16), (2, 5, 16)]


def numpy_pairs(x):
    """x [B, F, D] -> [B, F (F - 1) / 2] in float64: dot(x_i, x_j) for i < j, row by row, with a loop over pairs."""
    b, f, _ = x.shape
    x = x.astype(np.float64)
    cols = [np.sum(x[:, i] * x[:, j], axis=1) for i in range(f) for j in range(i + 1, f)]
    return np.stack(cols, axis=1) if cols else np.zeros((b, 0))


def numpy_grad(w, x):
    """The gradient of sum(pairs * w) with respect to x: S(w) x, S symmetric with zero diagonal."""
    b, f, _ = x.shape
    s = np.zeros((b, f, f))
    rows, cols = np.triu_indices(f, 1)
    s[:, rows, cols] = w
    s = s + s.transpose(0, 2, 1)
    return np.einsum("bij,bjk->bik", s, x.astype(np.float64))


def reference(fro, x):
    return fro.upper_triangle(tf.matmul(x, x, transpose_b=True))


def tolerance(x):
    """float32 rounding of dot products of length D: relative to the sum of |products|."""
    largest = float(np.abs(x).max()) if x.size else 0.0
    return 1e-6 * max(1.0, largest ** 2) * max(1, x.shape[2])


@pytest.mark.parametrize("size", SIZES)
def test_equals_numpy(fro, run, size):
    x = np.random.default_rng(sum(size)).normal(size=size).astype(np.float32)
    got = run(fro.dot_interaction, x)
    assert got.dtype == np.float32 and got.shape == (size[0], size[1] * (size[1] - 1) // 2), got.shape
    np.testing.assert_allclose(got, numpy_pairs(x), rtol=1e-5, atol=tolerance(x))


@pytest.mark.parametrize("size", SIZES)
def test_gradient_equals_numpy_and_the_matmul(fro, run, size):
    rng = np.random.default_rng(sum(size) + 1)
    x = rng.normal(size=size).astype(np.float32)
    w = rng.normal(size=(size[0], size[1] * (size[1] - 1) // 2)).astype(np.float32)

    def grad_of(fn):
        def g(x, w):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(fn(x) * w)
            return tf.convert_to_tensor(tape.gradient(loss, x))
        return g

    got = run(grad_of(fro.dot_interaction), x, w)
    assert got.dtype == np.float32 and got.shape == x.shape
    scale = tolerance(x) * max(1.0, float(np.abs(w).max()) if w.size else 0.0) * max(1, size[1])
    np.testing.assert_allclose(got, numpy_grad(w, x), rtol=1e-5, atol=scale)
    np.testing.assert_allclose(got, run(grad_of(lambda t: reference(fro, t)), x, w), rtol=1e-5, atol=scale)


@pytest.mark.parametrize("size", SIZES)
def test_feature_major_is_bit_equal_to_the_transposed_example_major(fro, run, size):
    """feature_major=True takes x as [F, B, D] (what DLRM's tf.stack(vectors, axis=0) builds): its pairs and its
    gradient (in that layout) are bit for bit the example-major op's on the transposed x, and so equal NumPy's."""
    rng = np.random.default_rng(sum(size) + 7)
    x = rng.normal(size=size).astype(np.float32)
    w = rng.normal(size=(size[0], size[1] * (size[1] - 1) // 2)).astype(np.float32)
    xf = np.ascontiguousarray(x.transpose(1, 0, 2))

    def pairs_and_grad(feature_major):
        def g(x, w):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = fro.dot_interaction(x, feature_major=feature_major)
                loss = tf.reduce_sum(y * w)
            return y, tf.convert_to_tensor(tape.gradient(loss, x))
        return g

    y, g = run(pairs_and_grad(False), x, w)
    yf, gf = run(pairs_and_grad(True), xf, w)
    assert yf.shape == y.shape and gf.shape == xf.shape, (yf.shape, gf.shape)
    np.testing.assert_array_equal(yf, y)
    np.testing.assert_array_equal(gf, g.transpose(1, 0, 2))
    np.testing.assert_allclose(yf, numpy_pairs(x), rtol=1e-5, atol=tolerance(x))


@pytest.mark.parametrize("size", SIZES)
def test_list_form_is_bit_equal_to_the_stack(fro, run, size):
    """x as F tensors [B, D] (DLRM's vectors, unstacked): the pairs, and each tensor's gradient (unstacked from the
    gradient op's feature-major output), are bit for bit those of the op on tf.stack(x, axis=1)."""
    rng = np.random.default_rng(sum(size) + 9)
    x = rng.normal(size=size).astype(np.float32)
    w = rng.normal(size=(size[0], size[1] * (size[1] - 1) // 2)).astype(np.float32)
    f = size[1]

    def stacked(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fro.dot_interaction(x)
            loss = tf.reduce_sum(y * w)
        return y, tf.convert_to_tensor(tape.gradient(loss, x))

    def listed(x, w):
        xs = tf.unstack(x, num=f, axis=1)
        with tf.GradientTape() as tape:
            tape.watch(xs)
            y = fro.dot_interaction(xs)
            loss = tf.reduce_sum(y * w)
        return y, tf.stack(tape.gradient(loss, xs), axis=1)

    y, g = run(stacked, x, w)
    yl, gl = run(listed, x, w)
    assert yl.shape == y.shape and gl.shape == g.shape, (yl.shape, gl.shape)
    np.testing.assert_array_equal(yl, y)
    np.testing.assert_array_equal(gl, g)


def test_list_form_second_order_static_shape_and_errors(fro, run_all, check):
    """The gradient of the list form's gradient op equals the stacked op's; the static shape comes from the
    tensors'; an empty list, another dtype and tensors of different shapes are errors naming the tensor."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(3, 5, 9)).astype(np.float32)
    upstream = tf.constant(rng.normal(size=(3, 10)).astype(np.float32))
    w = rng.normal(size=x.shape).astype(np.float32)
    results = []
    for listed in (False, True):
        xt = tf.constant(x)
        with tf.GradientTape(persistent=True) as outer:
            outer.watch([xt, upstream])
            with tf.GradientTape() as inner:
                xs = tf.unstack(xt, axis=1) if listed else xt
                inner.watch(xs)
                y = tf.reduce_sum(fro.dot_interaction(xs) * upstream)
            grad = inner.gradient(y, xs)
            z = tf.reduce_sum((tf.stack(grad, axis=1) if listed else grad) * w)
        results.append([outer.gradient(z, upstream).numpy(), outer.gradient(z, xt).numpy()])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    @tf.function(input_signature=[[tf.TensorSpec([None, 7], tf.float32)] * 5])
    def fn(xs):
        out = fro.dot_interaction(xs)
        assert out.shape.as_list() == [None, 10], out.shape
        return out

    assert fn([tf.zeros([2, 7])] * 5).shape == (2, 10)
    with pytest.raises(ValueError, match="at least one tensor"):
        fro.dot_interaction([])
    with pytest.raises(TypeError, match=r"x\[1\] must be float32, got float64"):
        fro.dot_interaction([tf.zeros([2, 3]), tf.zeros([2, 3], tf.float64)])
    ones = np.ones((2, 3), np.float32)
    check.expect_error(lambda: run_all(lambda a, b, c: fro.dot_interaction([a, b, c]), ones, ones,
                                       np.ones((2, 4), np.float32)), r"xs\[2\]|shape|incompatible")
    check.expect_error(lambda: run_all(lambda a: fro.dot_interaction([a, a]), np.ones((2, 3, 1), np.float32)),
                       r"rank|\[B, D\]")
    grad_op = fro.load_ops().fused_rec_dot_interaction_n_grad
    check.expect_error(lambda: run_all(lambda g, a: grad_op(g, [a, a, a]), np.zeros((2, 4), np.float32), ones),
                       r"grad must have shape \[2, 3\]", 4)


def test_feature_major_second_order_and_static_shape(fro):
    """The gradient of the feature-major gradient op equals the example-major one's, transposed; the static shape
    reads B and F from their places."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 6, 10)).astype(np.float32)
    upstream = tf.constant(rng.normal(size=(3, 15)).astype(np.float32))
    w = rng.normal(size=x.shape).astype(np.float32)
    results = []
    for feature_major, perm in ((False, (0, 1, 2)), (True, (1, 0, 2))):
        xt = tf.constant(x.transpose(perm))
        with tf.GradientTape(persistent=True) as outer:
            outer.watch([xt, upstream])
            with tf.GradientTape() as inner:
                inner.watch(xt)
                y = tf.reduce_sum(fro.dot_interaction(xt, feature_major=feature_major) * upstream)
            z = tf.reduce_sum(inner.gradient(y, xt) * w.transpose(perm))
        results.append([outer.gradient(z, upstream).numpy(), outer.gradient(z, xt).numpy().transpose(perm)])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    @tf.function(input_signature=[tf.TensorSpec([5, None, 7], tf.float32)])
    def fn(x):
        out = fro.dot_interaction(x, feature_major=True)
        assert out.shape.as_list() == [None, 10], out.shape
        return out

    assert fn(tf.zeros([5, 2, 7])).shape == (2, 10)


def test_large_values_and_zeros(fro, run):
    x = np.zeros((4, 6, 16), np.float32)
    x[1] = 1e3
    x[2, :, ::2] = -1.5
    x[3, 2] = np.float32(3e-20)
    got = run(fro.dot_interaction, x)
    np.testing.assert_allclose(got, numpy_pairs(x), rtol=1e-6)
    assert np.all(got[0] == 0)


def test_an_example_does_not_depend_on_its_batch(fro):
    """Each example is summed by one thread in a fixed order: its pairs are bit-equal alone and in a large batch."""
    x = np.random.default_rng(9).normal(size=(3000, 27, 16)).astype(np.float32)
    whole = fro.dot_interaction(x).numpy()
    for b in (0, 1499, 2999):
        np.testing.assert_array_equal(fro.dot_interaction(x[b:b + 1]).numpy()[0], whole[b])


@pytest.mark.parametrize("function", [False, True])
def test_gradient_numerically(fro, function):
    x = tf.constant(np.random.default_rng(3).normal(size=(3, 5, 9)).astype(np.float32))
    fn = tf.function(fro.dot_interaction) if function else fro.dot_interaction
    theoretical, numerical = tf.test.compute_gradient(fn, [x], delta=1e-2)
    np.testing.assert_allclose(theoretical[0], numerical[0], atol=2e-3)


def test_second_order_equals_the_matmul(fro):
    """The gradient of the gradient op, with respect to the pair gradients and to x, equals the reference's."""
    rng = np.random.default_rng(4)
    x = tf.constant(rng.normal(size=(2, 5, 11)).astype(np.float32))
    upstream = tf.constant(rng.normal(size=(2, 10)).astype(np.float32))
    w = tf.constant(rng.normal(size=(2, 5, 11)).astype(np.float32))
    results = []
    for fn in (fro.dot_interaction, lambda t: reference(fro, t)):
        with tf.GradientTape(persistent=True) as outer:
            outer.watch([x, upstream])
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = tf.reduce_sum(fn(x) * upstream)
            z = tf.reduce_sum(inner.gradient(y, x) * w)
        results.append([outer.gradient(z, upstream).numpy(), outer.gradient(z, x).numpy()])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_static_shape(fro):
    @tf.function(input_signature=[tf.TensorSpec([None, 5, 7], tf.float32)])
    def fn(x):
        out = fro.dot_interaction(x)
        assert out.shape.as_list() == [None, 10], out.shape
        return out

    assert fn(tf.zeros([2, 5, 7])).shape == (2, 10)


def test_errors(fro, run_all, check):
    check.expect_error(lambda: run_all(fro.dot_interaction, np.zeros((2, 3), np.float32)), r"rank|\[B, F, D\]")
    check.expect_error(lambda: run_all(lambda x: fro.dot_interaction(x, feature_major=True), np.zeros((2, 3), np.float32)),
                       r"rank|\[F, B, D\]")
    with pytest.raises(TypeError, match="float32, got float64"):
        fro.dot_interaction(tf.zeros([2, 3, 3], tf.float64))
    grad_op = fro.load_ops().fused_rec_dot_interaction_grad
    check.expect_error(lambda: run_all(grad_op, np.zeros((2, 4), np.float32), np.zeros((2, 3, 5), np.float32)),
                       r"grad must have shape \[2, 3\]", 4)
    # Feature-major x [3, 2, 5]: B = 2 examples of F = 3 vectors, 3 pairs each.
    check.expect_error(lambda: run_all(lambda g, x: grad_op(g, x, feature_major=True), np.zeros((3, 4), np.float32),
                                       np.zeros((3, 2, 5), np.float32)), r"grad must have shape \[2, 3\]", 4)


def test_portable_loops(fro, tmp_path):
    """The loops for CPUs without AVX2 and FMA, forced by TF_FUSEDREC_PORTABLE_KERNELS=1 in a fresh process (the
    choice is made once per process), against NumPy: forward and gradient, D with and without a tail."""
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    rng = np.random.default_rng(11)
    cases = {f"x{n}": rng.normal(size=size).astype(np.float32) for n, size in enumerate([(5, 27, 16), (3, 6, 13)])}
    np.savez(tmp_path / "in.npz", **cases)
    script = (
        "import sys, numpy as np, tensorflow as tf\n"
        "from tf_fusedrec import ops\n"
        "cases = np.load(sys.argv[1])\n"
        "out = {}\n"
        "for k in cases.files:\n"
        "    x = tf.constant(cases[k])\n"
        "    with tf.GradientTape() as tape:\n"
        "        tape.watch(x)\n"
        "        y = ops.dot_interaction(x)\n"
        "        loss = tf.reduce_sum(y * tf.range(1, y.shape[1] + 1, dtype=tf.float32))\n"
        "    out[k + '_y'], out[k + '_g'] = y.numpy(), tape.gradient(loss, x).numpy()\n"
        "    xf = tf.constant(np.ascontiguousarray(cases[k].transpose(1, 0, 2)))\n"
        "    with tf.GradientTape() as tape:\n"
        "        tape.watch(xf)\n"
        "        y = ops.dot_interaction(xf, feature_major=True)\n"
        "        loss = tf.reduce_sum(y * tf.range(1, y.shape[1] + 1, dtype=tf.float32))\n"
        "    out[k + '_yf'], out[k + '_gf'] = y.numpy(), tape.gradient(loss, xf).numpy()\n"
        "    xl = tf.unstack(tf.constant(cases[k]), axis=1)\n"
        "    with tf.GradientTape() as tape:\n"
        "        tape.watch(xl)\n"
        "        y = ops.dot_interaction(xl)\n"
        "        loss = tf.reduce_sum(y * tf.range(1, y.shape[1] + 1, dtype=tf.float32))\n"
        "    out[k + '_yl'], out[k + '_gl'] = y.numpy(), tf.stack(tape.gradient(loss, xl), axis=1).numpy()\n"
        "np.savez(sys.argv[2], **out)\n")
    env = {**os.environ, "TF_FUSEDREC_PORTABLE_KERNELS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    for k, x in cases.items():
        pairs = x.shape[1] * (x.shape[1] - 1) // 2
        w = np.broadcast_to(np.arange(1, pairs + 1, dtype=np.float32), (x.shape[0], pairs))
        np.testing.assert_allclose(out[k + "_y"], numpy_pairs(x), rtol=1e-5, atol=tolerance(x))
        np.testing.assert_allclose(out[k + "_g"], numpy_grad(w, x), rtol=1e-5, atol=tolerance(x) * pairs * x.shape[1])
        # Another rounding than the AVX2 loops, the same values to float32's precision.
        np.testing.assert_allclose(out[k + "_y"], fro.dot_interaction(x).numpy(), rtol=1e-5, atol=tolerance(x))
        np.testing.assert_array_equal(out[k + "_yf"], out[k + "_y"])  # the portable loops on the scratch rows
        np.testing.assert_array_equal(out[k + "_gf"], out[k + "_g"].transpose(1, 0, 2))
        np.testing.assert_array_equal(out[k + "_yl"], out[k + "_y"])
        np.testing.assert_array_equal(out[k + "_gl"], out[k + "_g"])
