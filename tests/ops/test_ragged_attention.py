"""ops.ragged_causal_attention (the GRM's HSTU attention, cc/kernels/ragged_attention_op.cc) against the NumPy loop
over pairs (reference.ragged_causal_attention) and against the pair-list TF form the GRM ran before (gathers and a
segment sum over grm.causal_pairs): outputs and the gradients of q, k, v and the bias, eager and in tf.function and a
v1 session; empty sequences first, last and only, one-token sequences, a 300-long one among short ones, with and
without the bias, the causal and a fixed normaliser; shape and row_splits errors naming the input."""

import numpy as np
import pytest
import tensorflow as tf

from tf_fusedrec.ops import reference

ATOL, RTOL = 1e-5, 1e-5

CASES = {  # lengths, heads, head_dim, bias buckets, attention_norm
    "mixed": ([3, 0, 7, 1, 12], 2, 4, 4, "causal"),
    "empty_first_last": ([0, 5, 2, 0], 1, 3, 2, "causal"),
    "all_empty": ([0, 0, 0], 2, 4, 3, "causal"),
    "no_sequences": ([], 2, 4, 3, "causal"),
    "ones": ([1, 1, 1], 2, 2, 3, "causal"),
    "fixed_no_bias": ([6, 4], 1, 5, 0, 7),
    "long_among_short": ([300, 2, 5], 2, 8, 16, "causal"),
    "one_bucket": ([9], 3, 2, 1, "causal"),
}


def make(lengths, heads, dim, buckets, seed=0):
    rng = np.random.default_rng(seed)
    t = int(sum(lengths))
    q, k, v = (rng.normal(size=(t, heads, dim)).astype(np.float32) for _ in range(3))
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    bias = rng.normal(size=(buckets, heads)).astype(np.float32)
    return q, k, v, splits, bias


def pair_form(q, k, v, splits, bias, attention_norm):
    """The GRM's attention before the op: gathers over the causal pairs and a segment sum."""
    from tf_fusedrec.models import grm  # noqa: PLC0415

    buckets = int(bias.shape[0])
    pairs = grm.causal_pairs(splits, buckets, attention_norm)
    scores = tf.reduce_sum(tf.gather(q, pairs.query) * tf.gather(k, pairs.key), axis=-1)
    if buckets:
        scores += tf.gather(bias, pairs.bucket)
    weights = tf.nn.silu(scores) / pairs.normalizer[:, None]
    return tf.math.unsorted_segment_sum(weights[..., None] * tf.gather(v, pairs.key), pairs.query,
                                        num_segments=tf.shape(q, out_type=tf.int64)[0])


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_equals_the_numpy_reference(fro, run, case):
    lengths, heads, dim, buckets, norm = CASES[case]
    q, k, v, splits, bias = make(lengths, heads, dim, buckets)
    got = run(lambda q, k, v, s, b: fro.ragged_causal_attention(q, k, v, s, b, norm), q, k, v, splits, bias)
    want = reference.ragged_causal_attention(q, k, v, splits, bias if buckets else None,
                                             0 if norm == "causal" else norm)
    assert got.shape == q.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_equal_the_pair_form(fro, case):
    lengths, heads, dim, buckets, norm = CASES[case]
    q, k, v, splits, bias = (tf.constant(x) for x in make(lengths, heads, dim, buckets, seed=1))
    upstream = tf.constant(np.random.default_rng(2).normal(size=q.shape).astype(np.float32))

    def grads(fn):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v, bias])
            out = fn(q, k, v, splits, bias, norm)
            loss = tf.reduce_sum(out * upstream)
        return out, tape.gradient(loss, [q, k, v, bias], unconnected_gradients="zero")

    for mode in ("eager", "graph"):
        op = fro.ragged_causal_attention if mode == "eager" else tf.function(fro.ragged_causal_attention)
        out, got = grads(op)
        want_out, want = grads(pair_form)
        np.testing.assert_allclose(out.numpy(), want_out.numpy(), rtol=RTOL, atol=ATOL)
        for name, g, w in zip(("q", "k", "v", "bias"), got, want):
            np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(), tf.convert_to_tensor(w).numpy(), rtol=RTOL,
                                       atol=ATOL, err_msg=f"{mode}: d{name}")


def test_gradients_equal_finite_differences(fro):
    q, k, v, splits, bias = (tf.constant(x) for x in make([4, 0, 3], 2, 3, 3, seed=3))
    theoretical, numerical = tf.test.compute_gradient(
        lambda q, k, v, b: fro.ragged_causal_attention(q, k, v, splits, b), [q, k, v, bias], delta=1e-2)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=2e-2, atol=2e-2)


def test_in_a_v1_session(fro, session_run):
    q, k, v, splits, bias = make([5, 0, 3], 2, 4, 3)
    got = session_run(lambda q, k, v, s, b: fro.ragged_causal_attention(q, k, v, s, b), q, k, v, splits, bias)
    np.testing.assert_allclose(got, reference.ragged_causal_attention(q, k, v, splits, bias), rtol=RTOL, atol=ATOL)


def test_a_sequence_does_not_see_the_others(fro):
    """Each sequence's outputs equal those it gets alone (no padding, no cross-talk), whatever the thread split."""
    lengths = [40, 3, 0, 25, 1]
    q, k, v, splits, bias = make(lengths, 2, 4, 5, seed=4)
    together = fro.ragged_causal_attention(q, k, v, splits, bias).numpy()
    for b, n in enumerate(lengths):
        s = slice(splits[b], splits[b + 1])
        alone = fro.ragged_causal_attention(q[s], k[s], v[s], np.array([0, n], np.int64), bias).numpy()
        np.testing.assert_array_equal(together[s], alone)


def test_errors_name_the_input(fro, run):
    q, k, v, splits, bias = make([3, 2], 2, 4, 3)
    cases = [
        ((q, k[:, :1], v, splits, bias), "k must have q's shape"),
        ((q, k, v[:4], splits, bias), "v must have q's shape"),
        ((q, k, v, np.array([1, 3, 5], np.int64), bias), "row_splits must start at 0"),
        ((q, k, v, np.array([0, 3, 2, 5], np.int64), bias), "row_splits must not decrease"),
        ((q, k, v, np.array([0, 3, 4], np.int64), bias), r"row_splits must end at the number of tokens \(5\)"),
        ((q, k, v, splits, np.zeros((3, 5), np.float32)), "bias must be \\[buckets, heads\\] with heads = 2"),
    ]
    for inputs, message in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            run(lambda q, k, v, s, b: fro.ragged_causal_attention(q, k, v, s, b), *inputs)
    with pytest.raises(ValueError, match="attention_norm must be 'causal' or a positive int, got 0"):
        fro.ragged_causal_attention(q, k, v, splits, bias, attention_norm=0)
