"""Tests of fro.owner_of and fro.partition_by_owner against hand computations and the NumPy oracle."""

import numpy as np
import pytest
import tensorflow as tf

from tf_fusedrec.ops.reference import MASK64, mix64_int

KEY_DTYPES = [np.int32, np.int64]




def owner_int(key, num_ranks):
    return mix64_int(key & MASK64) % num_ranks  # & MASK64 == two's complement reinterpretation of int64


def check_partition_invariants(res, keys, segs, num_ranks, owners):
    n = keys.shape[0]
    assert res.splits.shape == (num_ranks,) and res.splits.dtype == np.int32
    assert res.order.shape == (n,) and res.order.dtype == np.int32
    assert res.keys.dtype == keys.dtype
    assert int(res.splits.sum()) == n
    assert np.all(res.splits >= 0)
    # order is a permutation of 0..N-1 and the outputs are gathered by it
    np.testing.assert_array_equal(np.sort(res.order), np.arange(n))
    np.testing.assert_array_equal(res.keys, keys[res.order])
    if segs is None:
        assert res.segment_ids is None
    else:
        assert res.segment_ids.dtype == np.int32
        np.testing.assert_array_equal(res.segment_ids, segs[res.order])
    # block r holds exactly the keys owned by rank r, in input order (stable)
    bounds = np.concatenate([[0], np.cumsum(res.splits)])
    for r in range(num_ranks):
        block = res.order[bounds[r]:bounds[r + 1]]
        assert np.all(owners[block] == r), f"rank {r} block holds keys of other ranks"
        assert np.all(np.diff(block) > 0), f"rank {r} block is not in input order"
        assert block.size == int(np.sum(owners == r))


# ----------------------------------------------------------------------------------------------------------------
# Oracle sanity
# ----------------------------------------------------------------------------------------------------------------

def test_reference_mix64_known_values(ref):
    # splitmix64 with seed 0: the first three outputs are mix64(k * golden_gamma), k = 1, 2, 3.
    g = 0x9E3779B97F4A7C15
    x = np.array([g, (2 * g) & MASK64, (3 * g) & MASK64, 0], np.uint64)
    got = [int(v) for v in ref.mix64(x)]
    assert got == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0]
    rng = np.random.default_rng(0)
    xs = rng.integers(0, 2**64 - 1, 2000, dtype=np.uint64, endpoint=True)
    assert [int(v) for v in ref.mix64(xs)] == [mix64_int(int(v)) for v in xs]
    # a bijection: no collisions on distinct inputs
    assert np.unique(ref.mix64(np.arange(100_000, dtype=np.uint64))).size == 100_000


def test_reference_owner_and_partition(ref):
    keys = np.array([0, 1, -1, 2**63 - 1, -(2**63), 12345], np.int64)
    for r in (1, 2, 3, 7, 1000):
        assert ref.owner_of(keys, r).tolist() == [owner_int(int(k), r) for k in keys]
    # int32 keys are sign-extended
    assert ref.owner_of(np.array([-1, -5, 7], np.int32), 9).tolist() == [owner_int(k, 9) for k in (-1, -5, 7)]
    p = ref.partition_by_owner(np.array([3, 1, 2], np.int64), 1, np.array([2, 0, 1], np.int32))
    assert p.keys.tolist() == [3, 1, 2] and p.order.tolist() == [0, 1, 2] and p.splits.tolist() == [3]
    assert p.segment_ids.tolist() == [2, 0, 1]
    with pytest.raises(ValueError, match="num_ranks"):
        ref.owner_of(keys, 0)


# ----------------------------------------------------------------------------------------------------------------
# owner_of
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", KEY_DTYPES)
def test_owner_of_hand(fro, run, dtype):
    info = np.iinfo(dtype)
    vals = [0, 1, -1, 2, -2, 17, info.max, info.min, info.max - 1, info.min + 1]
    keys = np.array(vals, dtype)
    for num_ranks in (1, 2, 3, 8, 26, 1000, 2**31 - 1):
        got = run(lambda k: fro.owner_of(k, num_ranks), keys)
        assert got.dtype == np.int32
        assert got.tolist() == [owner_int(v, num_ranks) for v in vals], num_ranks


@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("n,num_ranks", [(0, 4), (1, 4), (5_000, 3), (200_000, 8), (200_000, 1), (20, 1000)])
def test_owner_of_random(fro, ref, run, gen, dtype, n, num_ranks):
    rng = np.random.default_rng([n, num_ranks])
    keys = gen.make_keys(rng, n, dtype, "wide")
    got = run(lambda k: fro.owner_of(k, num_ranks), keys)
    want = ref.owner_of(keys, num_ranks)
    assert got.dtype == np.int32 and got.shape == (n,)
    np.testing.assert_array_equal(got, want)
    if n:
        assert got.min() >= 0 and got.max() < num_ranks
    if num_ranks == 1:
        assert not got.any()
    if n >= 5_000:  # the hash spreads keys over all ranks
        assert np.unique(got).size == num_ranks


def test_owner_of_int32_sign_extended(fro, run):
    vals = np.array([-1, -2, -(2**31), 2**31 - 1, 0, 5, -12345], np.int64)
    a = run(lambda k: fro.owner_of(k, 13), vals.astype(np.int32))
    b = run(lambda k: fro.owner_of(k, 13), vals)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("num_ranks", [0, -3])
def test_owner_of_error_num_ranks(fro, run_all, check, num_ranks):
    keys = np.array([1, 2, 3], np.int64)
    check.expect_error(lambda: run_all(lambda k: fro.owner_of(k, num_ranks), keys), r"num_ranks|rank", num_ranks)


def test_owner_of_error_rank2(fro, run_all, check):
    keys = np.array([[1, 2], [3, 4]], np.int64)
    check.expect_error(lambda: run_all(lambda k: fro.owner_of(k, 4), keys), r"rank|vector|1-d|1d|shape|dimension")


# ----------------------------------------------------------------------------------------------------------------
# partition_by_owner
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", KEY_DTYPES)
def test_partition_hand(fro, run, check, ref, dtype):
    keys = np.array([10, -3, 10, 7, 0, 99, -3, 42], dtype)
    segs = np.array([0, 1, 2, 0, 1, 2, 0, 1], np.int32)
    num_ranks = 3
    owners = [owner_int(int(k), num_ranks) for k in keys]
    order = sorted(range(len(keys)), key=lambda i: (owners[i], i))  # stable sort by owner, by hand
    splits = [owners.count(r) for r in range(num_ranks)]
    want = ref.PartitionResult(keys[order], segs[order], np.array(splits, np.int32), np.array(order, np.int32))
    check.assert_same(ref.partition_by_owner(keys, num_ranks, segs), want)
    got = run(lambda k, s: fro.partition_by_owner(k, num_ranks, segment_ids=s), keys, segs)
    assert tuple(got._fields) == ("keys", "segment_ids", "splits", "order")
    check.assert_same(got, want)
    # one rank: identity
    got = run(lambda k: fro.partition_by_owner(k, 1), keys)
    check.assert_same(got, ref.PartitionResult(keys, None, np.array([8], np.int32), np.arange(8, dtype=np.int32)))


PARTITION_CASES = [
    # (n, num_ranks, key distribution, with segment ids)
    (0, 4, "dup", True),
    (0, 1, "dup", False),
    (1, 4, "wide", True),
    (1, 1, "wide", False),
    (1_000, 4, "zipf", True),
    (5_000, 8, "wide", False),
    (3_000, 1, "dup", True),
    (100, 1000, "distinct", True),  # num_ranks > N
    (3, 64, "wide", False),
    (70_000, 64, "dup", True),
    (200_000, 8, "zipf", True),
    (200_000, 3, "wide", False),
]


@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("n,num_ranks,dist,with_segs", PARTITION_CASES)
def test_partition_random(fro, ref, run, check, gen, dtype, n, num_ranks, dist, with_segs):
    rng = np.random.default_rng([n, num_ranks, len(dist)])
    keys = gen.make_keys(rng, n, dtype, dist)
    segs = gen.make_segments(rng, n, 26) if with_segs else None
    want = ref.partition_by_owner(keys, num_ranks, segs)
    if with_segs:
        got = run(lambda k, s: fro.partition_by_owner(k, num_ranks, segment_ids=s), keys, segs)
    else:
        got = run(lambda k: fro.partition_by_owner(k, num_ranks), keys)
    check.assert_same(got, want)
    owners = run(lambda k: fro.owner_of(k, num_ranks), keys)
    np.testing.assert_array_equal(owners, ref.owner_of(keys, num_ranks))
    check_partition_invariants(got, keys, segs, num_ranks, owners)


@pytest.mark.parametrize("dtype", KEY_DTYPES)
def test_partition_all_equal_keys(fro, ref, run, check, dtype):
    keys = np.full(100_000, -9, dtype)
    segs = (np.arange(100_000) % 26).astype(np.int32)
    got = run(lambda k, s: fro.partition_by_owner(k, 5, segment_ids=s), keys, segs)
    check.assert_same(got, ref.partition_by_owner(keys, 5, segs))
    owner = owner_int(-9, 5)
    assert got.splits.tolist() == [100_000 if r == owner else 0 for r in range(5)]
    np.testing.assert_array_equal(got.order, np.arange(100_000))


@pytest.mark.parametrize("dtype", KEY_DTYPES)
def test_partition_deterministic_large(fro, gen, check, dtype):
    rng = np.random.default_rng(5)
    keys = gen.make_keys(rng, gen.LARGE_N, dtype, "zipf")
    segs = gen.make_segments(rng, gen.LARGE_N, 100)
    outs = []
    for _ in range(3):
        r = fro.partition_by_owner(tf.constant(keys), 16, segment_ids=tf.constant(segs))
        outs.append(type(r)(*[t.numpy() for t in r]))
    for o in outs[1:]:
        check.assert_same(o, outs[0])


@pytest.mark.parametrize("threads", [1, 4])
def test_partition_session_mode(fro, ref, gen, check, session_run, threads):
    rng = np.random.default_rng(9)
    keys = gen.make_keys(rng, gen.LARGE_N, np.int64, "zipf")
    segs = gen.make_segments(rng, gen.LARGE_N, 26)
    (got, static) = session_run(lambda k, s: fro.partition_by_owner(k, 6, segment_ids=s), keys, segs,
                                intra_op_threads=threads, return_static_shapes=True)
    check.assert_same(got, ref.partition_by_owner(keys, 6, segs))
    assert static.splits.as_list() == [6]
    owners = session_run(lambda k: fro.owner_of(k, 6), keys, intra_op_threads=threads)
    np.testing.assert_array_equal(owners, ref.owner_of(keys, 6))
    got = session_run(lambda k: fro.partition_by_owner(k, 2), keys[:10].astype(np.int32))
    check.assert_same(got, ref.partition_by_owner(keys[:10].astype(np.int32), 2))


@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("num_ranks", [1, 7, 64])
def test_partition_static_shapes(fro, dtype, num_ranks):
    f = tf.function(autograph=False, func=lambda k, s: fro.partition_by_owner(k, num_ranks, segment_ids=s))
    out = f.get_concrete_function(tf.TensorSpec([None], tf.as_dtype(dtype)),
                                  tf.TensorSpec([None], tf.int32)).structured_outputs
    assert out.splits.shape.as_list() == [num_ranks]
    assert out.splits.dtype == tf.int32 and out.order.dtype == tf.int32
    assert out.keys.dtype == tf.as_dtype(dtype) and out.segment_ids.dtype == tf.int32
    assert out.keys.shape.rank == 1 and out.order.shape.rank == 1
    g = tf.function(autograph=False, func=lambda k: fro.partition_by_owner(k, num_ranks))
    out = g.get_concrete_function(tf.TensorSpec([None], tf.as_dtype(dtype))).structured_outputs
    assert out.splits.shape.as_list() == [num_ranks]
    assert out.segment_ids is None


@pytest.mark.parametrize("num_ranks", [0, -3])
def test_partition_error_num_ranks(fro, run_all, check, num_ranks):
    keys = np.array([1, 2, 3], np.int64)
    check.expect_error(lambda: run_all(lambda k: fro.partition_by_owner(k, num_ranks), keys),
                       r"num_ranks|rank", num_ranks)


def test_partition_error_mismatched_lengths(fro, run_all, check):
    keys = np.array([1, 2, 3, 4, 5], np.int64)
    segs = np.array([0, 1, 2], np.int32)
    check.expect_error(lambda: run_all(lambda k, s: fro.partition_by_owner(k, 4, segment_ids=s), keys, segs),
                       r"length|size|same|match|equal|dimension|shape", 5, 3)


def test_partition_error_rank2(fro, run_all, check):
    keys = np.array([[1, 2], [3, 4]], np.int64)
    check.expect_error(lambda: run_all(lambda k: fro.partition_by_owner(k, 4), keys),
                       r"rank|vector|1-d|1d|shape|dimension")
