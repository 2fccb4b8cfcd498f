"""Tests of fro.category_unique and fro.decode_unified_keys against hand computations and the NumPy oracle."""

import numpy as np
import pytest
import tensorflow as tf

from tf_fusedrec.ops.reference import GOLDEN, MASK64, mix64_int, to_int64

KEY_DTYPES = [np.int32, np.int64]
ENCODINGS = ["packed", "hashed"]
FIELDS = ("unified_keys", "inverse", "unique_segment_ids", "segment_counts")

# b = max(1, ceil(log2(num_segments))), worked out by hand.
EXPECTED_BITS = {1: 1, 2: 1, 3: 2, 4: 2, 5: 3, 7: 3, 8: 3, 9: 4, 26: 5, 32: 5, 33: 6, 100: 7, 128: 7, 129: 8,
                 2**20: 20, 2**20 + 1: 21}




def hashed_int(seg, key):
    return to_int64(mix64_int((key & MASK64) ^ mix64_int(seg + GOLDEN)))


def packed_int(seg, key, num_segments):
    return (seg << (63 - EXPECTED_BITS[num_segments])) | key


def run_cu(fro, run, keys, segs, num_segments, encoding):
    return run(lambda k, s: fro.category_unique(k, s, num_segments, encoding=encoding), keys, segs)


def check_invariants(fro, run, res, keys, segs, num_segments, encoding):
    n, u = keys.shape[0], res.unified_keys.shape[0]
    assert res.unified_keys.dtype == np.int64 and res.inverse.dtype == np.int32
    assert res.unique_segment_ids.dtype == np.int32 and res.segment_counts.dtype == np.int32
    assert res.inverse.shape == (n,) and res.unique_segment_ids.shape == (u,)
    assert res.segment_counts.shape == (num_segments,)
    # segment counts
    assert int(res.segment_counts.sum()) == u
    np.testing.assert_array_equal(res.segment_counts, np.bincount(res.unique_segment_ids, minlength=num_segments))
    np.testing.assert_array_equal(res.unique_segment_ids[res.inverse], segs)
    # the unified key of every input pair, computed directly
    if encoding == "packed":
        shift = 63 - EXPECTED_BITS.get(num_segments, max(1, (num_segments - 1).bit_length()))
        direct = (segs.astype(np.int64) << shift) | keys.astype(np.int64)
        np.testing.assert_array_equal(res.unified_keys[res.inverse], direct)
        # decode(category_unique(packed)) recovers (segment, key)
        ds, dk = run(lambda x: fro.decode_unified_keys(x, num_segments), res.unified_keys)
        assert ds.dtype == np.int32 and dk.dtype == np.int64
        np.testing.assert_array_equal(ds[res.inverse], segs)
        np.testing.assert_array_equal(dk[res.inverse], keys.astype(np.int64))
    # unified keys are unique (hashed: no collisions within a segment, none across on random data either)
    assert np.unique(res.unified_keys).size == u
    for s in np.flatnonzero(res.segment_counts)[:50]:
        assert np.unique(res.unified_keys[res.unique_segment_ids == s]).size == res.segment_counts[s]


# ----------------------------------------------------------------------------------------------------------------
# Oracle sanity
# ----------------------------------------------------------------------------------------------------------------

def test_reference_bits(ref):
    for n, b in EXPECTED_BITS.items():
        assert ref.packed_bits(n) == b, n


def test_reference_hand_examples(ref):
    keys = np.array([5, 7, 5, 7, 9], np.int64)
    segs = np.array([2, 0, 2, 2, 0], np.int32)
    r = ref.category_unique(keys, segs, 3, "packed")
    assert r.unified_keys.tolist() == [(2 << 61) | 5, 7, (2 << 61) | 7, 9]
    assert r.inverse.tolist() == [0, 1, 0, 2, 3]
    assert r.unique_segment_ids.tolist() == [2, 0, 2, 0]
    assert r.segment_counts.tolist() == [2, 0, 2]
    h = ref.category_unique(keys, segs, 3, "hashed")
    assert h.unified_keys.tolist() == [hashed_int(2, 5), hashed_int(0, 7), hashed_int(2, 7), hashed_int(0, 9)]
    assert h.inverse.tolist() == r.inverse.tolist()
    ds, dk = ref.decode_unified_keys(r.unified_keys, 3)
    assert ds.tolist() == [2, 0, 2, 0] and dk.tolist() == [5, 7, 7, 9]
    with pytest.raises(ValueError, match=r"key -5 in segment 1"):
        ref.category_unique(np.array([-5]), np.array([1], np.int32), 3)
    with pytest.raises(ValueError, match=rf"key {2**61} in segment 0"):
        ref.category_unique(np.array([2**61]), np.array([0], np.int32), 3)
    with pytest.raises(ValueError, match="segment id 3"):
        ref.category_unique(np.array([1]), np.array([3], np.int32), 3)


def test_wrapper_packed_bits_helpers(fro):
    for n, b in list(EXPECTED_BITS.items()) + [(2**31 - 1, 31), (2**31, 31), (2**31 + 1, 32)]:
        assert fro.packed_segment_bits(n) == b, n
        assert fro.packed_key_bits(n) == 63 - b, n


# ----------------------------------------------------------------------------------------------------------------
# Hand-worked examples through the op
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_hand_example(fro, ref, run, check, dtype, encoding):
    keys = np.array([5, 7, 5, 7, 9, 5], dtype)
    segs = np.array([2, 0, 2, 2, 0, 1], np.int32)
    pairs = [(2, 5), (0, 7), (2, 7), (0, 9), (1, 5)]
    if encoding == "packed":
        unified = [packed_int(s, k, 3) for s, k in pairs]
    else:
        unified = [hashed_int(s, k) for s, k in pairs]
    want = ref.CategoryUniqueResult(np.array(unified, np.int64), np.array([0, 1, 0, 2, 3, 4], np.int32),
                                    np.array([2, 0, 2, 0, 1], np.int32), np.array([2, 1, 2], np.int32))
    check.assert_same(ref.category_unique(keys, segs, 3, encoding), want)
    got = run_cu(fro, run, keys, segs, 3, encoding)
    assert tuple(got._fields) == FIELDS
    check.assert_same(got, want)


@pytest.mark.parametrize("dtype", KEY_DTYPES)
def test_default_encoding_is_packed(fro, run, dtype):
    keys = np.array([3, 4], dtype)
    segs = np.array([1, 0], np.int32)
    got = run(lambda k, s: fro.category_unique(k, s, 2), keys, segs)
    assert got.unified_keys.tolist() == [(1 << 62) | 3, 4]


def test_hashed_extreme_and_negative_keys(fro, ref, run, check):
    keys = np.array([-(2**63), 2**63 - 1, -1, 0, -(2**63), 1], np.int64)
    segs = np.array([0, 0, 1, 1, 3, 0], np.int32)
    got = run_cu(fro, run, keys, segs, 4, "hashed")
    assert got.unified_keys.tolist() == [hashed_int(int(s), int(k)) for s, k in
                                         [(0, -(2**63)), (0, 2**63 - 1), (1, -1), (1, 0), (3, -(2**63)), (0, 1)]]
    check.assert_same(got, ref.category_unique(keys, segs, 4, "hashed"))
    keys32 = np.array([-(2**31), 2**31 - 1, -1, -(2**31)], np.int32)
    segs32 = np.array([0, 0, 2, 1], np.int32)
    got = run_cu(fro, run, keys32, segs32, 3, "hashed")
    assert got.unified_keys.tolist() == [hashed_int(int(s), int(k)) for s, k in zip(segs32, keys32)]


def test_hashed_same_key_in_many_segments(fro, run):
    keys = np.full(300, 77, np.int64)
    segs = (np.arange(300) % 100).astype(np.int32)
    got = run_cu(fro, run, keys, segs, 100, "hashed")
    assert got.unified_keys.shape == (100,)
    assert np.unique(got.unified_keys).size == 100
    assert got.segment_counts.tolist() == [1] * 100
    np.testing.assert_array_equal(got.inverse, np.arange(300) % 100)


# ----------------------------------------------------------------------------------------------------------------
# Packed bit width b: the largest key fits, one above is rejected
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_segments", sorted(EXPECTED_BITS))
def test_packed_bit_width(fro, ref, run, check, num_segments):
    b = EXPECTED_BITS[num_segments]
    top = num_segments - 1
    largest = 2**(63 - b) - 1
    keys = np.array([largest, 0, largest, 1], np.int64)
    segs = np.array([top, top, 0, 0], np.int32)
    got = run_cu(fro, run, keys, segs, num_segments, "packed")
    want_unified = [(top << (63 - b)) | largest, top << (63 - b), largest, 1]
    if top == 0:
        want_unified = [largest, 0, 1]
    assert got.unified_keys.tolist() == want_unified
    check.assert_same(got, ref.category_unique(keys, segs, num_segments, "packed"))
    ds, dk = run(lambda x: fro.decode_unified_keys(x, num_segments), got.unified_keys)
    np.testing.assert_array_equal(ds[got.inverse], segs)
    np.testing.assert_array_equal(dk[got.inverse], keys)
    # one above the largest allowed key: error naming the segment and the key
    bad = np.array([1, largest + 1], np.int64)
    bad_segs = np.array([0, top], np.int32)
    check.expect_error(lambda: run_cu(fro, run, bad, bad_segs, num_segments, "packed"),
                       r"segment", top, largest + 1)


@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("bad_key,bad_seg", [(-5, 3), (-1, 0)])
def test_packed_negative_key_error(fro, run_all, check, dtype, bad_key, bad_seg):
    keys = np.array([1, bad_key, 2], dtype)
    segs = np.array([0, bad_seg, 1], np.int32)
    check.expect_error(lambda: run_cu(fro, run_all, keys, segs, 5, "packed"), r"segment", bad_seg, bad_key)


def test_packed_too_large_key_error(fro, run_all, check):
    keys = np.array([1, 2, 2**60, 3], np.int64)  # num_segments 7 -> b = 3 -> keys must be < 2**60
    segs = np.array([0, 6, 5, 1], np.int32)
    check.expect_error(lambda: run_cu(fro, run_all, keys, segs, 7, "packed"), r"segment", 5, 2**60)
    keys = np.array([2**63 - 1], np.int64)
    segs = np.array([0], np.int32)
    check.expect_error(lambda: run_cu(fro, run_all, keys, segs, 1, "packed"), r"segment", 0, 2**63 - 1)


def test_packed_bad_key_in_large_input(fro, run, check):
    n = 150_000
    keys = (np.arange(n, dtype=np.int64) * 7919) % 100_000
    segs = (np.arange(n) % 26).astype(np.int32)
    keys[140_001] = -42
    check.expect_error(lambda: run_cu(fro, run, keys, segs, 26, "packed"), r"segment", -42, 140_001 % 26)


def test_packed_int32_extremes(fro, ref, run, check):
    keys = np.array([2**31 - 1, 0, 2**31 - 1, 1], np.int32)
    segs = np.array([99, 99, 0, 50], np.int32)
    got = run_cu(fro, run, keys, segs, 100, "packed")
    check.assert_same(got, ref.category_unique(keys, segs, 100, "packed"))
    assert got.unified_keys[0] == (99 << 56) | (2**31 - 1)
    check.expect_error(lambda: run_cu(fro, run, np.array([-(2**31)], np.int32), np.array([4], np.int32), 100,
                                      "packed"), r"segment", 4, -(2**31))


# ----------------------------------------------------------------------------------------------------------------
# Random inputs against the oracle
# ----------------------------------------------------------------------------------------------------------------

RANDOM_CASES = [
    # (n, num_segments, key distribution, skewed segments)
    (1_000, 26, "zipf", True),
    (3_000, 100, "dup", False),
    (2_000, 1, "distinct", False),
    (2_000, 5, "wide", False),
    (70_000, 128, "dup", True),
    (200_000, 26, "zipf", True),
    (200_000, 100, "wide", False),
]


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("n,num_segments,dist,skew", RANDOM_CASES)
def test_random_matches_reference(fro, ref, run, check, gen, encoding, dtype, n, num_segments, dist, skew):
    rng = np.random.default_rng([n, num_segments, len(dist), len(encoding), np.dtype(dtype).itemsize])
    limit = 2**(63 - ref.packed_bits(num_segments)) if encoding == "packed" else None
    keys = gen.make_keys(rng, n, dtype, dist, nonneg_limit=limit)
    segs = gen.make_segments(rng, n, num_segments, skew)
    want = ref.category_unique(keys, segs, num_segments, encoding)
    got = run_cu(fro, run, keys, segs, num_segments, encoding)
    check.assert_same(got, want)
    check_invariants(fro, run, got, keys, segs, num_segments, encoding)
    # consistent with segment_unique on the same pairs
    su = ref.segment_unique(keys, segs)
    np.testing.assert_array_equal(got.inverse, su.inverse)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("dtype", KEY_DTYPES)
def test_edge_cases(fro, ref, run, check, encoding, dtype):
    cases = [
        (np.array([], dtype), np.array([], np.int32), 4),
        (np.array([], dtype), np.array([], np.int32), 1),
        (np.array([11], dtype), np.array([2], np.int32), 3),
        (np.full(100_000, 8, dtype), np.full(100_000, 6, np.int32), 7),
        (np.arange(5000, dtype=dtype)[::-1].copy(), np.zeros(5000, np.int32), 1),
        (np.full(600, 3, dtype), (np.arange(600) % 26).astype(np.int32), 26),
    ]
    for keys, segs, num_segments in cases:
        want = ref.category_unique(keys, segs, num_segments, encoding)
        got = run_cu(fro, run, keys, segs, num_segments, encoding)
        check.assert_same(got, want)
        check_invariants(fro, run, got, keys, segs, num_segments, encoding)
    empty = run_cu(fro, run, np.array([], dtype), np.array([], np.int32), 4, encoding)
    assert empty.segment_counts.tolist() == [0, 0, 0, 0] and empty.unified_keys.shape == (0,)


@pytest.mark.parametrize("num_segments", [1, 3, 26, 128, 129])
def test_decode_matches_reference(fro, ref, run, check, num_segments):
    rng = np.random.default_rng(num_segments)
    shift = 63 - EXPECTED_BITS[num_segments]
    segs = rng.integers(0, num_segments, 3000).astype(np.int64)
    keys = rng.integers(0, 2**shift, 3000, dtype=np.int64)
    keys[:3] = [0, 1, 2**shift - 1]
    unified = (segs << shift) | keys
    got = run(lambda x: fro.decode_unified_keys(x, num_segments), unified)
    want = ref.decode_unified_keys(unified, num_segments)
    check.assert_same(got, want, fields=[0, 1])
    np.testing.assert_array_equal(got[0], segs)
    np.testing.assert_array_equal(got[1], keys)
    empty = run(lambda x: fro.decode_unified_keys(x, num_segments), np.array([], np.int64))
    assert empty[0].shape == (0,) and empty[1].shape == (0,)
    assert empty[0].dtype == np.int32 and empty[1].dtype == np.int64


# ----------------------------------------------------------------------------------------------------------------
# Determinism, Session mode, static shapes
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ENCODINGS)
def test_deterministic_large(fro, gen, check, encoding):
    rng = np.random.default_rng(21)
    keys = gen.make_keys(rng, gen.LARGE_N, np.int64, "zipf", nonneg_limit=2**50)
    segs = gen.make_segments(rng, gen.LARGE_N, 100)
    outs = []
    for _ in range(3):
        r = fro.category_unique(tf.constant(keys), tf.constant(segs), 100, encoding=encoding)
        outs.append(type(r)(*[t.numpy() for t in r]))
    for o in outs[1:]:
        check.assert_same(o, outs[0])


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_session_mode(fro, ref, gen, check, session_run, encoding, threads):
    rng = np.random.default_rng(31)
    keys = gen.make_keys(rng, gen.LARGE_N, np.int64, "zipf", nonneg_limit=2**50)
    segs = gen.make_segments(rng, gen.LARGE_N, 26)
    got, static = session_run(lambda k, s: fro.category_unique(k, s, 26, encoding=encoding), keys, segs,
                              intra_op_threads=threads, return_static_shapes=True)
    check.assert_same(got, ref.category_unique(keys, segs, 26, encoding))
    assert static.segment_counts.as_list() == [26]
    if encoding == "packed":
        dec = session_run(lambda x: fro.decode_unified_keys(x, 26), got.unified_keys)
        check.assert_same(dec, ref.decode_unified_keys(got.unified_keys, 26), fields=[0, 1])


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("num_segments", [1, 26, 100])
def test_static_shapes(fro, encoding, dtype, num_segments):
    f = tf.function(autograph=False, func=lambda k, s: fro.category_unique(k, s, num_segments, encoding=encoding))
    out = f.get_concrete_function(tf.TensorSpec([None], tf.as_dtype(dtype)),
                                  tf.TensorSpec([None], tf.int32)).structured_outputs
    assert out.segment_counts.shape.as_list() == [num_segments]
    assert out.unified_keys.dtype == tf.int64 and out.inverse.dtype == tf.int32
    assert out.unique_segment_ids.dtype == tf.int32 and out.segment_counts.dtype == tf.int32
    assert out.unified_keys.shape.rank == 1 and out.inverse.shape.rank == 1


# ----------------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("bad", [-1, -2])
def test_error_negative_segment_id(fro, run_all, check, encoding, dtype, bad):
    keys = np.array([1, 2, 3], dtype)
    segs = np.array([0, bad, 1], np.int32)
    check.expect_error(lambda: run_cu(fro, run_all, keys, segs, 3, encoding), r"segment", bad)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("bad,num_segments", [(7, 5), (5, 5), (1, 1)])
def test_error_segment_id_too_large(fro, run_all, check, encoding, bad, num_segments):
    keys = np.array([1, 2, 3], np.int64)
    segs = np.array([0, bad, 0], np.int32)
    check.expect_error(lambda: run_cu(fro, run_all, keys, segs, num_segments, encoding), r"segment", bad)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("num_segments", [0, -1])
def test_error_num_segments(fro, run_all, check, encoding, num_segments):
    keys = np.array([1, 2], np.int64)
    segs = np.array([0, 0], np.int32)
    check.expect_error(lambda: run_cu(fro, run_all, keys, segs, num_segments, encoding), r"num_segments",
                       num_segments)


def test_error_unknown_encoding(fro, run_all, check):
    keys = np.array([1, 2], np.int64)
    segs = np.array([0, 0], np.int32)
    check.expect_error(lambda: run_cu(fro, run_all, keys, segs, 3, "bogus"), r"encoding", "bogus")


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_error_mismatched_lengths(fro, run_all, check, encoding):
    keys = np.array([1, 2, 3, 4, 5], np.int64)
    segs = np.array([0, 0, 0], np.int32)
    check.expect_error(lambda: run_cu(fro, run_all, keys, segs, 3, encoding),
                       r"length|size|same|match|equal|dimension|shape", 5, 3)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_error_rank2_keys(fro, run_all, check, encoding):
    keys = np.array([[1, 2], [3, 4]], np.int64)
    segs = np.array([0, 0], np.int32)
    check.expect_error(lambda: run_cu(fro, run_all, keys, segs, 3, encoding), r"rank|vector|1-d|1d|shape|dimension")


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_error_segment_id_out_of_range_in_large_input(fro, run, check, encoding):
    n = 150_000  # multithreaded path; the bad id is near the end
    keys = np.arange(n, dtype=np.int64) % 5000
    segs = (np.arange(n) % 26).astype(np.int32)
    segs[149_000] = 26
    check.expect_error(lambda: run_cu(fro, run, keys, segs, 26, encoding), r"segment", 26)
