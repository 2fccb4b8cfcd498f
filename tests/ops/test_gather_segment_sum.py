"""Tests of fro.gather_segment_sum (a group's recover gather and its features' combiner sums in one op) against the
NumPy oracle and the TF op chain it replaces: gather -> split per feature -> unsorted_segment_sum.

Forward and gradient must equal both exactly (every output row is summed in id order from zero, as TensorFlow's CPU
segment sum does); the gradient is also checked numerically in float64, the second-order gradient against the
oracle, and bad input gives errors naming the feature list position, the value and its position.
"""

import numpy as np
import pytest
import tensorflow as tf

DTYPES = [np.float16, np.float32, np.float64]


def case(seed, rows, dim, ids_per_feature, outputs_per_feature, dtype=np.float32):
    """(params [rows, dim], index int32 [n], per feature int64 segment ids, per feature output rows)."""
    rng = np.random.default_rng(seed)
    params = rng.normal(size=(rows, dim)).astype(dtype)
    index = rng.integers(0, max(rows, 1), sum(ids_per_feature)).astype(np.int32)
    segments = [rng.integers(0, max(m, 1), n).astype(np.int64) for n, m in zip(ids_per_feature, outputs_per_feature)]
    return params, index, segments, list(outputs_per_feature)


CASES = {
    "several": (0, 40, 5, [7, 12, 30], [4, 9, 30]),
    "empty_feature": (1, 10, 3, [5, 0, 6], [3, 2, 6]),
    "no_rows_no_ids": (2, 10, 3, [4, 0], [2, 0]),
    "many_duplicates": (3, 3, 16, [50, 50], [2, 1]),
    "dim_1": (4, 20, 1, [10, 10], [10, 5]),
    "one_feature": (5, 8, 16, [20], [6]),
    "empty_params": (6, 0, 4, [0, 0], [3, 1]),
}


def chain(params, index, segments, sizes):
    """The op chain the fused op replaces."""
    parts = tf.split(tf.gather(params, index), [int(tf.size(s)) for s in segments], num=len(segments))
    return [tf.math.unsorted_segment_sum(p, s, n) for p, s, n in zip(parts, segments, sizes)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_the_oracle(fro, ref, run, check, name, dtype):
    params, index, segments, sizes = case(*CASES[name], dtype=dtype)
    m = len(segments)
    got = run(lambda p, i, *s: tuple(fro.gather_segment_sum(p, i, s, sizes)), params, index, *segments)
    want = ref.gather_segment_sum(params, index, segments, sizes)
    check.assert_same(list(got), want)
    assert len(got) == m


@pytest.mark.parametrize("name", sorted(CASES))
def test_session(fro, ref, session_run, check, name):
    params, index, segments, sizes = case(*CASES[name])
    got = session_run(lambda p, i, *s: tuple(fro.gather_segment_sum(p, i, s, sizes)), params, index, *segments)
    check.assert_same(list(got), ref.gather_segment_sum(params, index, segments, sizes))


@pytest.mark.parametrize("large", [False, True])
def test_forward_and_gradient_equal_the_chain(fro, large):
    """Bit for bit, forward and backward; the large case runs the kernels' multi-task paths (one task per feature
    forward, per range of params rows backward)."""
    shape = (11, 5000, 16, [60_000, 90_000, 50_000], [2048, 2048, 150_000]) if large else CASES["several"]
    params, index, segments, sizes = case(*shape)
    params = tf.constant(params)
    weights = [tf.constant(np.random.default_rng(9).normal(size=(n, params.shape[1])).astype(np.float32))
               for n in sizes]
    results = []
    for fn in (fro.gather_segment_sum, chain):
        with tf.GradientTape() as tape:
            tape.watch(params)
            outs = fn(params, index, segments, sizes)
            loss = tf.add_n([tf.reduce_sum(o * w) for o, w in zip(outs, weights)])
        results.append(([o.numpy() for o in outs], tf.convert_to_tensor(tape.gradient(loss, params)).numpy()))
    for a, b in zip(results[0][0], results[1][0]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_gradient_equals_the_oracle(fro, ref):
    params, index, segments, sizes = case(*CASES["several"])
    params = tf.constant(params)
    grads = [np.random.default_rng(f).normal(size=(n, params.shape[1])).astype(np.float32)
             for f, n in enumerate(sizes)]
    with tf.GradientTape() as tape:
        tape.watch(params)
        outs = fro.gather_segment_sum(params, index, segments, sizes)
    got = tape.gradient(outs, params, output_gradients=[tf.constant(g) for g in grads])
    np.testing.assert_array_equal(got.numpy(),
                                  ref.gather_segment_sum_grad(grads, index, segments, sizes, params.shape[0]))


def test_unused_output_has_zero_gradient(fro, ref):
    params, index, segments, sizes = case(*CASES["several"])
    params = tf.constant(params)
    with tf.GradientTape() as tape:
        tape.watch(params)
        loss = tf.reduce_sum(fro.gather_segment_sum(params, index, segments, sizes)[1])  # outputs 0 and 2 unused
    grads = [np.zeros((n, params.shape[1]), np.float32) for n in sizes]
    grads[1][:] = 1.0
    np.testing.assert_array_equal(tape.gradient(loss, params).numpy(),
                                  ref.gather_segment_sum_grad(grads, index, segments, sizes, params.shape[0]))


@pytest.mark.parametrize("function", [False, True])
def test_gradient_numerically(fro, function):
    params, index, segments, sizes = case(*CASES["several"], dtype=np.float64)

    def fn(p):
        return tf.concat(fro.gather_segment_sum(p, index, segments, sizes), axis=0)

    theoretical, numerical = tf.test.compute_gradient(tf.function(fn) if function else fn, [tf.constant(params)])
    np.testing.assert_allclose(theoretical[0], numerical[0], atol=1e-6)


def test_second_order(fro, ref):
    """The gradient of the gradient op (with respect to the upstream gradients) is the op itself."""
    params, index, segments, sizes = case(*CASES["several"], dtype=np.float64)
    params = tf.constant(params)
    upstream = [tf.constant(np.random.default_rng(f).normal(size=(n, params.shape[1]))) for f, n in enumerate(sizes)]
    w = np.random.default_rng(7).normal(size=params.shape)
    with tf.GradientTape() as outer:
        outer.watch(upstream)
        with tf.GradientTape() as inner:
            inner.watch(params)
            outs = fro.gather_segment_sum(params, index, segments, sizes)
        grad = inner.gradient(outs, params, output_gradients=upstream)
        z = tf.reduce_sum(grad * w)
    got = outer.gradient(z, upstream)
    for g, want in zip(got, ref.gather_segment_sum(w, index, segments, sizes)):
        np.testing.assert_array_equal(g.numpy(), want)


def test_static_shapes(fro):
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None], tf.int32),
                                  tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64)])
    def fn(params, index, segments, rows):
        known, unknown = fro.gather_segment_sum(params, index, [segments[:1], segments[1:]], [3, rows])
        assert known.shape.as_list() == [3, 4], known.shape
        assert unknown.shape.as_list() == [None, 4], unknown.shape
        return known, unknown

    known, unknown = fn(tf.ones([2, 4]), tf.constant([0, 1, 1], tf.int32), tf.constant([2, 0, 0], tf.int64),
                        tf.constant(1, tf.int64))
    np.testing.assert_array_equal(known.numpy()[2], np.ones(4))
    np.testing.assert_array_equal(unknown.numpy(), 2 * np.ones((1, 4)))


def test_errors(fro, run_all, check):
    params = np.ones((5, 2), np.float32)

    def call(index, segments, sizes, p=params):
        return lambda: run_all(lambda q, i, *s: tuple(fro.gather_segment_sum(q, i, s, sizes)), p, index, *segments)

    ok_segments = [np.array([0, 1], np.int64), np.array([0], np.int64)]
    check.expect_error(call(np.array([0, 5, 1], np.int32), ok_segments, [2, 1]), r"index must be in \[0, 5\)", 5,
                       "position 1")
    check.expect_error(call(np.array([0, 1, 2], np.int32), [np.array([0, 2], np.int64), np.array([0], np.int64)],
                            [2, 1]), r"segment_ids\[0\] must be in \[0, 2\)", 2, "position 1")
    check.expect_error(call(np.array([0, 1, 2], np.int32), [np.array([0, 1], np.int64), np.array([-1], np.int64)],
                            [2, 1]), r"segment_ids\[1\] must be in \[0, 1\)", -1, "position 0")
    check.expect_error(call(np.array([0, 1], np.int32), ok_segments, [2, 1]), r"segment_ids hold more ids than index")
    check.expect_error(call(np.array([0, 1, 2, 3], np.int32), ok_segments, [2, 1]),
                       r"index has 4 entries but segment_ids hold 3")
    check.expect_error(call(np.array([0, 1, 2], np.int32), ok_segments, [2, -1]), r"num_segments\[1\] must be >= 0",
                       -1)
    check.expect_error(call(np.array([0], np.int32), [np.array([0], np.int64)], [1], p=np.ones(5, np.float32)),
                       r"params must be a matrix|rank")
    with pytest.raises(TypeError, match="params must be float16, float32 or float64, got int32"):
        fro.gather_segment_sum(np.ones((2, 2), np.int32), [0], [[0]], [1])
    with pytest.raises(ValueError, match="non-empty lists of one length, got 2 and 1"):
        fro.gather_segment_sum(params, [0], [[0], []], [1])
    with pytest.raises(ValueError, match="non-empty lists of one length, got 0 and 0"):
        fro.gather_segment_sum(params, [], [], [])


# --- group_lookup._gather_rows: its gradient through this op, bit for bit the segment sum it replaced -------------

@pytest.mark.parametrize("case", ["random", "zipf", "empty", "one_row_for_all", "unused_rows", "float64"])
def test_gather_rows_gradient_is_bit_equal_to_unsorted_segment_sum(run, case):
    """The lookup's rows gathered to their positions: forward tf.gather, backward the upstream rows summed per row
    with gather_segment_sum, which must equal tf.math.unsorted_segment_sum(upstream, index, U) bit for bit (each row
    summed from zero in position order), duplicates, unused rows (zero) and an empty index included."""
    from tf_fusedrec.distributed import group_lookup as gl  # noqa: PLC0415

    rng = np.random.default_rng(len(case))
    dtype = np.float64 if case == "float64" else np.float32
    u, m, dim = {"random": (50, 400, 16), "zipf": (300, 5000, 8), "empty": (7, 0, 4), "one_row_for_all": (3, 200, 5),
                 "unused_rows": (100, 30, 3), "float64": (20, 90, 6)}[case]
    if case == "zipf":
        index = np.minimum(rng.zipf(1.2, m) - 1, u - 1)
    elif case == "one_row_for_all":
        index = np.full(m, 1)
    else:
        index = rng.integers(0, u, m)
    rows = rng.normal(size=(u, dim)).astype(dtype)
    # Magnitudes apart, so that another order of the additions would show in the last bits.
    upstream = (rng.normal(size=(m, dim)) * 10.0 ** rng.integers(-6, 6, size=(m, 1))).astype(dtype)
    index = index.astype(np.int32)

    def grads(rows, index, upstream):
        with tf.GradientTape() as tape:
            tape.watch(rows)
            out = gl._gather_rows(rows, index)  # noqa: SLF001
        return out, tape.gradient(out, rows, output_gradients=upstream)

    out, grad = run(grads, rows, index, upstream)
    np.testing.assert_array_equal(out, rows[index])
    want = run(lambda i, g: tf.math.unsorted_segment_sum(g, i, u), index, upstream)
    assert grad.dtype == dtype and grad.shape == (u, dim)
    np.testing.assert_array_equal(grad, want)
