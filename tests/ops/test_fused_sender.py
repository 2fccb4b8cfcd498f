"""Tests of fro.fused_sender against the NumPy oracle and the TF op chain it replaces, and of its use in group_lookup.

The chain is what AllToAllRoute sends with segment dedup: segment_unique -> partition_by_owner -> the wire's
encode (group_lookup.PackedWire / PairWire), recover_index = invert_permutation(order)[inverse], and the unique pairs
counted per category. Every output must equal both, element by element and in order.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_fusedrec.distributed import group_lookup as gl
from tf_fusedrec.ops.reference import MASK64, mix64_int
from tests.ops.sender_fixtures import LoopbackComm, check_message, key_bits, large_input, make_group

KEY_DTYPES = [np.int32, np.int64]
WIRES = ["packed", "pair"]
RANKS = [1, 2, 3, 8]
FIELDS = ("message", "splits", "recover_index", "segment_counts")


def sender(fro, num_ranks, num_segments, wire):
    return lambda k, s: fro.fused_sender(k, s, num_ranks, num_segments, wire=wire)


def chain(fro, num_ranks, num_segments, wire):
    """The op chain the fused op replaces, built from the existing ops and group_lookup's wires."""

    def run(keys, segments):
        unique = fro.segment_unique(keys, segments)
        part = fro.partition_by_owner(unique.unique_keys, num_ranks, segment_ids=unique.unique_segment_ids)
        encoder = gl.PackedWire(num_segments) if wire == "packed" else gl.PairWire()
        message = encoder.encode(tf.cast(part.keys, tf.int64), part.segment_ids)
        recover_index = tf.gather(tf.math.invert_permutation(part.order), unique.inverse)
        counts = tf.math.bincount(unique.unique_segment_ids, minlength=num_segments, maxlength=num_segments,
                                  dtype=tf.int64)
        return fro.FusedSenderResult(message, part.splits, recover_index, counts)

    return run


def check_all(fro, ref, run, check, keys, segs, num_ranks, num_segments, wire):
    """op == oracle == chain; returns the op's result."""
    want = ref.fused_sender(keys, segs, num_ranks, num_segments, wire)
    got = run(sender(fro, num_ranks, num_segments, wire), keys, segs)
    assert tuple(got._fields) == FIELDS
    check.assert_same(got, want)
    check.assert_same(run(chain(fro, num_ranks, num_segments, wire), keys, segs), want)
    check_invariants(got, keys, segs, num_ranks, num_segments, wire)
    return got


def check_invariants(res, keys, segs, num_ranks, num_segments, wire):
    """What any correct result satisfies, independently of the oracle: decoding message[recover_index] gives back
    every input pair, blocks hold their owner's pairs, the pairs are unique."""
    n = keys.shape[0]
    if wire == "packed":
        bits = key_bits(num_segments)
        sent_keys, sent_segs = res.message & ((1 << bits) - 1), res.message >> bits
    else:
        assert res.message.ndim == 2 and res.message.shape[1] == 2
        sent_keys, sent_segs = res.message[:, 0], res.message[:, 1]
    u = sent_keys.shape[0]
    assert res.splits.shape == (num_ranks,) and int(res.splits.sum()) == u
    assert res.recover_index.shape == (n,) and res.segment_counts.shape == (num_segments,)
    np.testing.assert_array_equal(sent_keys[res.recover_index], keys.astype(np.int64))
    np.testing.assert_array_equal(sent_segs[res.recover_index], segs)
    check_message(res, sent_keys, sent_segs, num_ranks, num_segments)


# ----------------------------------------------------------------------------------------------------------------
# Oracle sanity (no compiled library)
# ----------------------------------------------------------------------------------------------------------------

def test_reference_hand_example(ref):
    keys = np.array([10, -3, 10, 7, 10, 42], np.int64)
    segs = np.array([0, 1, 0, 0, 2, 1], np.int32)
    # unique pairs in first-occurrence order: (0,10) (1,-3) (0,7) (2,10) (1,42), each then placed by owner, stably
    pairs = [(10, 0), (-3, 1), (7, 0), (10, 2), (42, 1)]
    owners = [mix64_int(k & MASK64) % 3 for k, _ in pairs]
    order = sorted(range(5), key=lambda j: (owners[j], j))
    position = {j: p for p, j in enumerate(order)}
    got = ref.fused_sender(keys, segs, 3, 3, "pair")
    assert got.message.tolist() == [list(pairs[j]) for j in order]
    assert got.splits.tolist() == [owners.count(r) for r in range(3)]
    assert got.recover_index.tolist() == [position[j] for j in [0, 1, 0, 2, 3, 4]]
    assert got.segment_counts.tolist() == [2, 2, 1]
    with pytest.raises(ValueError, match="does not fit"):
        ref.fused_sender(keys, segs, 3, 3, "packed")  # -3 cannot be packed
    with pytest.raises(ValueError, match="segment id 3 >= num_segments 3"):
        ref.fused_sender(keys, np.array([0, 1, 0, 0, 3, 1], np.int32), 3, 3, "pair")


# ----------------------------------------------------------------------------------------------------------------
# Against the oracle and the chain
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("dtype", KEY_DTYPES)
def test_hand_example(fro, ref, run, check, wire, dtype):
    keys = np.array([10, 3, 10, 7, 10, 42, 3], dtype)
    segs = np.array([0, 1, 0, 0, 2, 1, 1], np.int32)
    got = check_all(fro, ref, run, check, keys, segs, 3, 3, wire)
    assert got.message.shape[0] == 5 and got.segment_counts.tolist() == [2, 2, 1]


RANDOM_CASES = [
    # (n, num_segments, key distribution, skewed segments)
    (500, 1, "dup", False),
    (2_000, 26, "zipf", True),
    (26 * 2048, 26, "zipf", True),  # the criteo_synthetic group: 26 features, 2048 samples
    (3_000, 100, "dup", False),
    (1_500, 7, "distinct", True),
    (70_000, 26, "wide", False),  # above the recover pass's multithreaded threshold
]


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("num_ranks", RANKS)
@pytest.mark.parametrize("n,num_segments,dist,skew", RANDOM_CASES)
def test_random_int64(fro, ref, run, check, gen, wire, num_ranks, n, num_segments, dist, skew):
    rng = np.random.default_rng([n, num_segments, len(dist), num_ranks])
    limit = 1 << key_bits(num_segments) if wire == "packed" else None
    keys = gen.make_keys(rng, n, np.int64, dist, nonneg_limit=limit)
    segs = gen.make_segments(rng, n, num_segments, skew)
    check_all(fro, ref, run, check, keys, segs, num_ranks, num_segments, wire)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("num_ranks", [2, 3])
def test_random_int32(fro, ref, run, check, gen, wire, num_ranks):
    rng = np.random.default_rng([32, num_ranks])
    keys = gen.make_keys(rng, 5_000, np.int32, "zipf", nonneg_limit=(1 << 31) if wire == "packed" else None)
    segs = gen.make_segments(rng, 5_000, 26)
    check_all(fro, ref, run, check, keys, segs, num_ranks, 26, wire)


def _edge_cases(wire):
    bits = key_bits(5)
    hi = (1 << bits) - 1 if wire == "packed" else 2**63 - 1
    lo = 0 if wire == "packed" else -(2**63)
    rng = np.random.default_rng(3)
    return {
        "empty": (np.array([], np.int64), np.array([], np.int32), 5),
        "one": (np.array([42], np.int64), np.array([4], np.int32), 5),
        "all_duplicates": (np.full(5000, 17, np.int64), np.full(5000, 2, np.int32), 5),
        "same_id_every_segment": (np.full(600, 123, np.int64), (np.arange(600) % 5).astype(np.int32), 5),
        "extremes": (np.array([hi, lo, 0, hi, lo, 1, hi - 1, lo + 1, hi], np.int64),
                     np.array([0, 0, 0, 1, 0, 4, 0, 0, 0], np.int32), 5),
        "many_categories": (rng.integers(0, 300, 20_000).astype(np.int64),
                            rng.integers(0, 5000, 20_000).astype(np.int32), 5000),
        "one_category_of_many": (np.arange(100, dtype=np.int64), np.full(100, 4999, np.int32), 5000),
    }


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("num_ranks", RANKS)
@pytest.mark.parametrize("name", list(_edge_cases("pair")))
def test_edge_cases(fro, ref, run, check, wire, num_ranks, name):
    keys, segs, num_segments = _edge_cases(wire)[name]
    got = check_all(fro, ref, run, check, keys, segs, num_ranks, num_segments, wire)
    # packed extremes: lo == 0, so (lo, 0) and (0, 0) are one pair
    expected_u = {"empty": 0, "one": 1, "all_duplicates": 1, "same_id_every_segment": 5,
                  "extremes": 7 if wire == "pair" else 6}
    if name in expected_u:
        assert got.message.shape[0] == expected_u[name]


def test_packed_key_bits_boundary(fro, ref, run, check):
    """The largest packable key of each segment count, in the highest segment: the sign bit stays clear."""
    for num_segments in (1, 2, 3, 26, 2**20 + 1):
        bits = key_bits(num_segments)
        keys = np.array([(1 << bits) - 1, 0], np.int64)
        segs = np.array([num_segments - 1, num_segments - 1], np.int32)
        got = check_all(fro, ref, run, check, keys, segs, 2, num_segments, "packed")
        assert (got.message >= 0).all()


@pytest.mark.parametrize("threads", [1, 4])
def test_session_mode_large(fro, ref, gen, check, session_run, threads):
    """Above the dedup's sharded threshold (LARGE_N pairs, 4 pool threads): the result does not depend on threads."""
    keys, segs = large_input(gen)
    for wire in WIRES:
        want = ref.fused_sender(keys, segs, 3, 26, wire)
        check.assert_same(session_run(sender(fro, 3, 26, wire), keys, segs, intra_op_threads=threads), want)
        check.assert_same(session_run(chain(fro, 3, 26, wire), keys, segs, intra_op_threads=threads), want)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("dtype", KEY_DTYPES)
def test_static_shapes_and_dtypes(fro, wire, dtype):
    f = tf.function(sender(fro, 3, 26, wire), autograph=False)
    out = f.get_concrete_function(tf.TensorSpec([None], tf.as_dtype(dtype)),
                                  tf.TensorSpec([None], tf.int32)).structured_outputs
    assert out.message.dtype == tf.int64
    assert out.message.shape.as_list() == ([None] if wire == "packed" else [None, 2])
    assert out.splits.dtype == tf.int32 and out.splits.shape.as_list() == [3]
    assert out.recover_index.dtype == tf.int32 and out.recover_index.shape.as_list() == [None]
    assert out.segment_counts.dtype == tf.int64 and out.segment_counts.shape.as_list() == [26]
    g = tf.function(sender(fro, 3, 26, wire), autograph=False)  # a new function: f's trace would serve [7] too
    out = g.get_concrete_function(tf.TensorSpec([7], tf.as_dtype(dtype)), tf.TensorSpec([7], tf.int32))
    assert out.structured_outputs.recover_index.shape.as_list() == [7]


def test_no_gradient(fro):
    from tensorflow.python.framework import ops as tf_ops  # noqa: PLC0415  (the gradient registry)

    with tf.Graph().as_default():
        out = fro.fused_sender(tf.constant([1, 2, 1], tf.int64), tf.constant([0, 0, 1], tf.int32), 2, 2)
        assert out.message.op.type == "FusedRec>FusedSender"
        assert tf_ops.get_gradient_function(out.message.op) is None  # registered as having none (ids)


# ----------------------------------------------------------------------------------------------------------------
# Errors: what the chain reports, or clearer
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("wire", WIRES)
def test_error_negative_segment_id_like_the_chain(fro, run_all, check, wire):
    keys = np.array([1, 2, 3, 4], np.int64)
    segs = np.array([0, 1, -1, 0], np.int32)
    # the chain's error (segment_unique's) names the segment id and its position; so does the fused op's
    check.expect_error(lambda: run_all(chain(fro, 2, 3, wire), keys, segs), r"segment_ids", -1, "position 2")
    check.expect_error(lambda: run_all(sender(fro, 2, 3, wire), keys, segs), r"segment_ids must be in \[0, 3\)", -1,
                       "position 2")


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("bad,num_segments", [(7, 5), (5, 5), (1, 1)])
def test_error_segment_id_too_large(fro, run_all, check, wire, bad, num_segments):
    """The chain does not check an upper bound (a packed pair would silently spill into the sign bit); the fused op,
    which knows the group's category count, names the segment id."""
    keys = np.array([1, 2, 3], np.int64)
    segs = np.array([0, bad, 0], np.int32)
    check.expect_error(lambda: run_all(sender(fro, 2, num_segments, wire), keys, segs),
                       rf"segment_ids must be in \[0, {num_segments}\)", bad, "position 1")


@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("bad_key", [-1, -(2**31)])
def test_error_packed_negative_key(fro, run_all, check, dtype, bad_key):
    keys = np.array([1, bad_key, 2], dtype)
    segs = np.array([0, 3, 1], np.int32)
    msg = check.expect_error(lambda: run_all(sender(fro, 2, 5, "packed"), keys, segs), r"cannot be sent packed",
                             bad_key, 3)
    assert "segment 3" in msg and "encoding='hashed'" in msg


def test_error_packed_key_too_large(fro, ref, run_all, check):
    """The chain's encode would corrupt the pair silently (its owner-side decode masks the high bits); the fused op
    names the first unpackable pair in first-occurrence order, as the oracle does."""
    keys = np.array([1, 2, 2**60, 3, 2**61], np.int64)  # num_segments 7 -> b = 3 -> keys must be < 2**60
    segs = np.array([0, 6, 5, 1, 2], np.int32)
    check.expect_error(lambda: run_all(sender(fro, 2, 7, "packed"), keys, segs), r"\[0, 2\^60\)", 2**60, 5)
    with pytest.raises(ValueError, match=f"key {2**60} in segment 5"):
        ref.fused_sender(keys, segs, 2, 7, "packed")
    # the pair wire takes any int64
    got = run_all(sender(fro, 2, 7, "pair"), keys, segs)
    check.assert_same(got, ref.fused_sender(keys, segs, 2, 7, "pair"))


@pytest.mark.parametrize("attr,value", [("num_ranks", 0), ("num_ranks", -3), ("num_segments", 0)])
def test_error_attrs(fro, run_all, check, attr, value):
    keys = np.array([1, 2, 3], np.int64)
    segs = np.array([0, 0, 0], np.int32)
    args = {"num_ranks": 2, "num_segments": 1, attr: value}
    check.expect_error(lambda: run_all(lambda k, s: fro.fused_sender(k, s, **args), keys, segs), attr, value)


def test_error_unknown_wire(fro, run_all, check):
    keys = np.array([1, 2], np.int64)
    segs = np.array([0, 0], np.int32)
    check.expect_error(lambda: run_all(sender(fro, 2, 1, "bogus"), keys, segs), r"wire", "bogus")


def test_error_mismatched_lengths(fro, run_all, check):
    keys = np.array([1, 2, 3, 4, 5], np.int64)
    segs = np.array([0, 0, 0], np.int32)
    check.expect_error(lambda: run_all(sender(fro, 2, 1, "pair"), keys, segs),
                       r"length|size|same|match|equal|dimension|shape", 5, 3)


def test_error_rank2_keys(fro, run_all, check):
    keys = np.array([[1, 2], [3, 4]], np.int64)
    segs = np.array([0, 0], np.int32)
    check.expect_error(lambda: run_all(sender(fro, 2, 1, "pair"), keys, segs), r"rank|vector|1-d|1d|shape|dimension")


# ----------------------------------------------------------------------------------------------------------------
# In group_lookup: FusedSender == ChainSender, GroupDist for GroupDist
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["packed", "hashed"])
@pytest.mark.parametrize("num_ranks", RANKS)
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_group_lookup_senders_equal(encoding, num_ranks, mode):
    # features 3 and 4 share feature 0's rows: their ids are pairs of category 0
    group = make_group(encoding, [0, 1, 2, 0, 0])
    rng = np.random.default_rng([num_ranks, len(encoding)])
    ids = [tf.constant(rng.integers(0, 40, size), tf.int64) for size in (300, 0, 1, 50, 200)]
    dists = {}
    for fused in (True, False):
        lookup = gl.FusedGroupLookup(group, None, LoopbackComm(num_ranks), "test", fused_sender=fused)
        expected = gl.FusedSender if fused and num_ranks > 1 else gl.ChainSender
        assert type(lookup._sender) is expected  # noqa: SLF001  (the choice under test)
        fn = lookup.input_dist if mode == "eager" else tf.function(lookup.input_dist, autograph=False)
        dists[fused] = [t.numpy() for t in fn(ids)]
    for field, a, b in zip(gl.GroupDist._fields, dists[True], dists[False]):
        assert a.dtype == b.dtype and a.shape == b.shape, field
        np.testing.assert_array_equal(a, b, err_msg=field)


def test_fused_sender_default_and_module_switch(monkeypatch):
    group = make_group("packed", [0, 1])
    assert type(gl.FusedGroupLookup(group, None, LoopbackComm(2), "t")._sender) is gl.FusedSender  # noqa: SLF001
    monkeypatch.setattr(gl, "FUSED_SENDER", False)
    assert type(gl.FusedGroupLookup(group, None, LoopbackComm(2), "t")._sender) is gl.ChainSender  # noqa: SLF001
    # dedup="none" keeps the chain: the fused op always deduplicates
    lookup = gl.FusedGroupLookup(group, None, LoopbackComm(2), "t", dedup="none", fused_sender=True)
    assert type(lookup._sender) is gl.ChainSender  # noqa: SLF001
