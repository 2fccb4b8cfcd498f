"""Tests of fro.segment_unique against hand-worked examples and the NumPy oracle (tf_fusedrec.ops.reference)."""

import numpy as np
import pytest
import tensorflow as tf

KEY_DTYPES = [np.int32, np.int64]
FIELDS = ("unique_keys", "unique_segment_ids", "inverse", "counts")


def check_invariants(res, keys, segs):
    """Properties any correct result has, independent of the oracle."""
    n = keys.shape[0]
    u = res.unique_keys.shape[0]
    assert res.unique_segment_ids.shape == (u,) and res.counts.shape == (u,)
    assert res.inverse.shape == (n,)
    assert res.unique_keys.dtype == keys.dtype
    assert res.unique_segment_ids.dtype == np.int32
    assert res.inverse.dtype == np.int32 and res.counts.dtype == np.int32
    # inverse reconstructs the inputs
    if n:
        assert res.inverse.min() >= 0 and res.inverse.max() < u
    np.testing.assert_array_equal(res.unique_keys[res.inverse], keys)
    np.testing.assert_array_equal(res.unique_segment_ids[res.inverse], segs)
    # counts sum to N and agree with inverse
    assert int(res.counts.sum()) == n
    np.testing.assert_array_equal(res.counts, np.bincount(res.inverse, minlength=u))
    # pairs are unique
    pairs = set(zip(res.unique_segment_ids.tolist(), res.unique_keys.tolist()))
    assert len(pairs) == u
    # first-occurrence order: unique j first appears in inverse before unique j+1
    if n:
        _, first = np.unique(res.inverse, return_index=True)
        assert np.all(np.diff(first) > 0)
        assert first.shape == (u,)


# ----------------------------------------------------------------------------------------------------------------
# Oracle sanity (runs without the compiled library)
# ----------------------------------------------------------------------------------------------------------------

def test_reference_hand_example(ref):
    r = ref.segment_unique(np.array([5, 5, 7, 5], np.int32), np.array([0, 1, 0, 0], np.int32))
    np.testing.assert_array_equal(r.unique_keys, [5, 5, 7])
    np.testing.assert_array_equal(r.unique_segment_ids, [0, 1, 0])
    np.testing.assert_array_equal(r.inverse, [0, 1, 2, 0])
    np.testing.assert_array_equal(r.counts, [2, 1, 1])
    assert r.unique_keys.dtype == np.int32


def test_reference_empty_and_errors(ref):
    r = ref.segment_unique(np.array([], np.int64), np.array([], np.int32))
    assert all(getattr(r, f).shape == (0,) for f in FIELDS)
    with pytest.raises(ValueError, match="negative segment id -1"):
        ref.segment_unique(np.array([1, 2], np.int64), np.array([0, -1], np.int32))
    with pytest.raises(ValueError, match="same length"):
        ref.segment_unique(np.array([1, 2], np.int64), np.array([0], np.int32))


# ----------------------------------------------------------------------------------------------------------------
# Hand-worked examples through the op
# ----------------------------------------------------------------------------------------------------------------

HAND_CASES = [
    # keys, segs, unique_keys, unique_segs, inverse, counts
    ([5, 5, 7, 5], [0, 1, 0, 0], [5, 5, 7], [0, 1, 0], [0, 1, 2, 0], [2, 1, 1]),
    ([3, 1, 3, 1, 2], [0, 0, 0, 0, 0], [3, 1, 2], [0, 0, 0], [0, 1, 0, 1, 2], [2, 2, 1]),
    ([9], [4], [9], [4], [0], [1]),
    ([-1, -1, -1], [2, 2, 2], [-1], [2], [0, 0, 0], [3]),
    ([4, 4, 4, 4], [0, 1, 2, 1], [4, 4, 4], [0, 1, 2], [0, 1, 2, 1], [1, 2, 1]),
    ([8, 6, 7, 5], [1, 1, 0, 0], [8, 6, 7, 5], [1, 1, 0, 0], [0, 1, 2, 3], [1, 1, 1, 1]),
    ([0, -2, 0, 2, -2], [3, 3, 0, 3, 0], [0, -2, 0, 2, -2], [3, 3, 0, 3, 0], [0, 1, 2, 3, 4], [1, 1, 1, 1, 1]),
]


@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("case", HAND_CASES, ids=[str(i) for i in range(len(HAND_CASES))])
def test_hand_examples(fro, ref, run, check, dtype, case):
    keys, segs, uk, us, inv, cnt = case
    keys = np.array(keys, dtype)
    segs = np.array(segs, np.int32)
    want = ref.SegmentUniqueResult(np.array(uk, dtype), np.array(us, np.int32), np.array(inv, np.int32),
                                   np.array(cnt, np.int32))
    check.assert_same(ref.segment_unique(keys, segs), want)  # the oracle agrees with the hand computation
    got = run(fro.segment_unique, keys, segs)
    assert tuple(got._fields) == FIELDS
    check.assert_same(got, want)


# ----------------------------------------------------------------------------------------------------------------
# Random inputs against the oracle
# ----------------------------------------------------------------------------------------------------------------

RANDOM_CASES = [
    # (n, num_segments, key distribution, skewed segments)
    (1_000, 26, "zipf", True),
    (3_000, 100, "dup", False),
    (2_000, 7, "wide", False),
    (1_500, 26, "distinct", True),
    (70_000, 26, "dup", True),  # just above the multithreaded threshold
    (200_000, 26, "zipf", True),
    (200_000, 100, "wide", False),
]


@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("n,num_segments,dist,skew", RANDOM_CASES)
def test_random_matches_reference(fro, ref, run, check, gen, dtype, n, num_segments, dist, skew):
    rng = np.random.default_rng([n, num_segments, len(dist), np.dtype(dtype).itemsize])
    keys = gen.make_keys(rng, n, dtype, dist)
    segs = gen.make_segments(rng, n, num_segments, skew)
    want = ref.segment_unique(keys, segs)
    got = run(fro.segment_unique, keys, segs)
    check.assert_same(got, want)
    check_invariants(got, keys, segs)
    if dist == "dup" and n >= 50 * num_segments * 10:
        assert want.unique_keys.shape[0] <= 50 * num_segments  # really heavily duplicated


# ----------------------------------------------------------------------------------------------------------------
# Edge cases
# ----------------------------------------------------------------------------------------------------------------

def _edge_cases(dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(7)
    return {
        "empty": (np.array([], dtype), np.array([], np.int32)),
        "one": (np.array([42], dtype), np.array([3], np.int32)),
        "all_equal": (np.full(1000, -17, dtype), np.zeros(1000, np.int32)),
        "all_equal_large": (np.full(100_000, 5, dtype), np.zeros(100_000, np.int32)),
        "all_distinct": (rng.permutation(5000).astype(dtype) - 2500, np.zeros(5000, np.int32)),
        "negative": (-rng.integers(1, 40, 500).astype(dtype), rng.integers(0, 3, 500).astype(np.int32)),
        "extremes": (np.array([info.max, info.min, 0, -1, info.max, info.min, 1, info.max - 1, info.min + 1,
                               info.max], dtype),
                     np.array([0, 0, 0, 0, 1, 0, 0, 0, 0, 0], np.int32)),
        "same_id_many_segments": (np.full(600, 123, dtype), (np.arange(600) % 200).astype(np.int32)),
        "big_segment_ids": (np.array([1, 1, 2, 1], dtype),
                            np.array([2**31 - 1, 0, 2**31 - 1, 2**31 - 1], np.int32)),
    }


@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("name", list(_edge_cases(np.int32)))
def test_edge_cases(fro, ref, run, check, dtype, name):
    keys, segs = _edge_cases(dtype)[name]
    want = ref.segment_unique(keys, segs)
    got = run(fro.segment_unique, keys, segs)
    check.assert_same(got, want)
    check_invariants(got, keys, segs)
    expected_u = {"empty": 0, "one": 1, "all_equal": 1, "all_equal_large": 1, "all_distinct": 5000,
                  "same_id_many_segments": 200, "big_segment_ids": 3, "extremes": 8}
    if name in expected_u:
        assert got.unique_keys.shape[0] == expected_u[name]


def test_int64_extremes_not_confused_with_int32(fro, run, check, ref):
    # Keys that agree in the low 32 bits must stay distinct in int64.
    keys = np.array([1, 1 + 2**32, -(2**63), 2**63 - 1, 2**32, 0, 1], np.int64)
    segs = np.zeros(7, np.int32)
    got = run(fro.segment_unique, keys, segs)
    check.assert_same(got, ref.segment_unique(keys, segs))
    assert got.unique_keys.shape[0] == 6


# ----------------------------------------------------------------------------------------------------------------
# Determinism, Session mode, static shapes
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", KEY_DTYPES)
def test_deterministic_large(fro, gen, check, dtype):
    rng = np.random.default_rng(11)
    keys = gen.make_keys(rng, gen.LARGE_N, dtype, "zipf")
    segs = gen.make_segments(rng, gen.LARGE_N, 26)
    first = fro.segment_unique(tf.constant(keys), tf.constant(segs))
    first = type(first)(*[t.numpy() for t in first])
    for _ in range(3):
        again = fro.segment_unique(tf.constant(keys), tf.constant(segs))
        check.assert_same(type(first)(*[t.numpy() for t in again]), first)


@pytest.mark.parametrize("threads", [1, 4])
def test_session_mode(fro, ref, gen, check, session_run, threads):
    rng = np.random.default_rng(3)
    keys = gen.make_keys(rng, gen.LARGE_N, np.int64, "zipf")
    segs = gen.make_segments(rng, gen.LARGE_N, 100)
    got = session_run(fro.segment_unique, keys, segs, intra_op_threads=threads)
    check.assert_same(got, ref.segment_unique(keys, segs))
    small_k, small_s = np.array([5, 5, 7, 5], np.int32), np.array([0, 1, 0, 0], np.int32)
    got = session_run(fro.segment_unique, small_k, small_s, intra_op_threads=threads)
    check.assert_same(got, ref.segment_unique(small_k, small_s))


@pytest.mark.parametrize("dtype", KEY_DTYPES)
def test_static_shapes_and_dtypes(fro, dtype):
    f = tf.function(fro.segment_unique, autograph=False)
    cf = f.get_concrete_function(tf.TensorSpec([None], tf.as_dtype(dtype)), tf.TensorSpec([None], tf.int32))
    out = cf.structured_outputs
    assert out.unique_keys.dtype == tf.as_dtype(dtype)
    assert out.unique_segment_ids.dtype == tf.int32
    assert out.inverse.dtype == tf.int32 and out.counts.dtype == tf.int32
    for t in out:
        assert t.shape.rank == 1


# ----------------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("bad", [-1, -7])
def test_error_negative_segment_id(fro, run_all, check, dtype, bad):
    keys = np.array([1, 2, 3, 4], dtype)
    segs = np.array([0, 1, bad, 0], np.int32)
    check.expect_error(lambda: run_all(fro.segment_unique, keys, segs), r"segment", bad)


def test_error_negative_segment_id_large(fro, run, check):
    # The bad id is deep inside a large input (multithreaded path).
    n = 150_000
    keys = np.arange(n, dtype=np.int64) % 1000
    segs = np.zeros(n, np.int32)
    segs[123_457] = -3
    check.expect_error(lambda: run(fro.segment_unique, keys, segs), r"segment", -3)


@pytest.mark.parametrize("dtype", KEY_DTYPES)
def test_error_mismatched_lengths(fro, run_all, check, dtype):
    keys = np.array([1, 2, 3, 4, 5], dtype)
    segs = np.array([0, 0, 0], np.int32)
    check.expect_error(lambda: run_all(fro.segment_unique, keys, segs),
                       r"length|size|same|match|equal|dimension|shape", 5, 3)


@pytest.mark.parametrize("dtype", KEY_DTYPES)
def test_error_rank2_keys(fro, run_all, check, dtype):
    keys = np.array([[1, 2], [3, 4]], dtype)
    segs = np.array([0, 0], np.int32)
    check.expect_error(lambda: run_all(fro.segment_unique, keys, segs), r"rank|vector|1-d|1d|shape|dimension")


def test_error_rank2_segment_ids(fro, run_all, check):
    keys = np.array([1, 2, 3, 4], np.int64)
    segs = np.zeros((2, 2), np.int32)
    check.expect_error(lambda: run_all(fro.segment_unique, keys, segs), r"rank|vector|1-d|1d|shape|dimension")
