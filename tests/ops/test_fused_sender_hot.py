"""Tests of fro.fused_sender_hot (the sender of a group with a replicated hot set) against the NumPy oracle and the
TF op chain it replaces, and of its use in group_lookup (FusedGroupLookup with a HotReplica).

The chain is FusedGroupLookup's hot sender before the op: segment_unique, the unified key of each unique pair
(group_lookup.unified_keys), searchsorted in the hot keys (classify_hot), then the cold pairs' partition and encoding
and the hot pairs placed after the message. Every output must equal the oracle's and the chain's, element by element
and in order; independently of both, decoding the message and the hot keys at recover_index gives every input pair
back.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_fusedrec.distributed import group_lookup as gl
from tf_fusedrec.distributed import replication
from tests.ops.sender_fixtures import LoopbackComm, check_message, key_bits, large_input, make_group

WIRES = ["packed", "pair"]
ENCODING = {"packed": "packed", "pair": "hashed"}  # a group's encoding picks its wire
RANKS = [1, 2, 3, 8]
FIELDS = ("message", "splits", "recover_index", "segment_counts", "hot_position", "hot_hits")


def sender(fro, num_ranks, num_segments, wire):
    return lambda k, s, h, f: fro.fused_sender_hot(k, s, h, num_ranks, num_segments, wire=wire, feature_sizes=f)


def feature_sizes_of(rng, n, features=5):
    """int32 [features] sizes summing to n, some of them 0."""
    cuts = np.sort(rng.integers(0, n + 1, features - 1))
    return np.diff(np.concatenate([[0], cuts, [n]])).astype(np.int32)


def chain(fro, num_ranks, num_segments, wire):
    """The op chain the op replaces, from the existing ops and group_lookup's functions."""

    def run(keys, segments, hot_keys, feature_sizes):
        unique = fro.segment_unique(keys, segments)
        unique_keys = tf.cast(unique.unique_keys, tf.int64)
        position, is_hot = gl.classify_hot(unique_keys, unique.unique_segment_ids, hot_keys, num_segments,
                                           ENCODING[wire])
        cold_at = tf.reshape(tf.where(tf.logical_not(is_hot)), [-1])
        hot_at = tf.reshape(tf.where(is_hot), [-1])
        cold_keys, cold_segments = tf.gather(unique_keys, cold_at), tf.gather(unique.unique_segment_ids, cold_at)
        part = fro.partition_by_owner(cold_keys, num_ranks, segment_ids=cold_segments)
        encoder = gl.PackedWire(num_segments) if wire == "packed" else gl.PairWire()
        message = encoder.encode(part.keys, part.segment_ids)
        num_cold = tf.size(cold_keys, out_type=tf.int32)
        buffer_position = tf.dynamic_stitch(
            [tf.cast(cold_at, tf.int32), tf.cast(hot_at, tf.int32)],
            [tf.math.invert_permutation(part.order), num_cold + tf.range(tf.size(hot_at, out_type=tf.int32))])
        counts = tf.math.bincount(cold_segments, minlength=num_segments, maxlength=num_segments, dtype=tf.int64)
        # hot_hits as group_lookup's chain counts them: each position's hot flag, summed per feature
        features = tf.repeat(tf.range(tf.size(feature_sizes)), feature_sizes)
        hot_hits = tf.math.unsorted_segment_sum(tf.cast(tf.gather(is_hot, unique.inverse), tf.int64), features,
                                                tf.size(feature_sizes))
        return fro.FusedSenderHotResult(message, part.splits, tf.gather(buffer_position, unique.inverse), counts,
                                        tf.gather(position, hot_at), hot_hits)

    return run


def unified_of(ref, keys, segs, num_segments, wire):
    """The unified keys of the distinct pairs of (keys, segs), in first-occurrence order (the oracle's)."""
    if keys.size == 0:
        return np.zeros([0], np.int64)
    return ref.category_unique(keys, segs, num_segments, ENCODING[wire]).unified_keys


def hot_set_of(ref, rng, keys, segs, num_segments, wire, fraction, strangers=5):
    """Sorted hot keys: a random `fraction` of the input's pairs plus `strangers` keys of no input pair."""
    unified = unified_of(ref, keys, segs, num_segments, wire)
    chosen = unified[rng.random(unified.size) < fraction]
    others = rng.integers(0, 1 << 40, strangers).astype(np.int64) if wire == "packed" else rng.integers(
        -(2**63), 2**63 - 1, strangers, dtype=np.int64)
    return np.unique(np.concatenate([chosen, np.setdiff1d(others, unified)])).astype(np.int64)


def check_all(fro, ref, run, check, keys, segs, hot, num_ranks, num_segments, wire, sizes=None):
    """op == oracle == chain, and the invariants; returns the op's result. sizes: the features' (default: 5 random,
    summing to the keys' length)."""
    if sizes is None:
        sizes = feature_sizes_of(np.random.default_rng(keys.shape[0]), keys.shape[0])
    want = ref.fused_sender_hot(keys, segs, hot, num_ranks, num_segments, wire, sizes)
    got = run(sender(fro, num_ranks, num_segments, wire), keys, segs, hot, sizes)
    assert tuple(got._fields) == FIELDS
    check.assert_same(got, want, fields=range(6))
    check.assert_same(run(chain(fro, num_ranks, num_segments, wire), keys, segs, hot, sizes), want, fields=range(6))
    check_invariants(ref, got, keys, segs, hot, num_ranks, num_segments, wire)
    hot_at = got.recover_index >= got.message.shape[0]
    assert got.hot_hits.tolist() == [int(p.sum()) for p in np.split(hot_at, np.cumsum(sizes)[:-1])]
    return got


def check_invariants(ref, res, keys, segs, hot, num_ranks, num_segments, wire):
    """Without the oracle: every input pair comes back from the message (cold) or the hot keys (hot); a pair is hot
    exactly when its unified key is in the hot set; the message's pairs are unique and in their owners' blocks."""
    n = keys.shape[0]
    if wire == "packed":
        bits = key_bits(num_segments)
        sent_keys, sent_segs = res.message & ((1 << bits) - 1), res.message >> bits
    else:
        sent_keys, sent_segs = res.message[:, 0], res.message[:, 1]
    c, h = sent_keys.shape[0], res.hot_position.shape[0]
    assert res.recover_index.shape == (n,) and int(res.splits.sum()) == c
    assert n == 0 or (res.recover_index.min() >= 0 and res.recover_index.max() < c + h)
    assert sorted(set(res.recover_index[res.recover_index >= c].tolist())) == list(range(c, c + h))
    if n:
        unique = ref.category_unique(keys, segs, num_segments, ENCODING[wire])
        unified = unique.unified_keys[unique.inverse]  # each position's unified key
        cold = res.recover_index < c
        np.testing.assert_array_equal(sent_keys[res.recover_index[cold]], keys[cold].astype(np.int64))
        np.testing.assert_array_equal(sent_segs[res.recover_index[cold]], segs[cold])
        assert not np.isin(unified[cold], hot).any(), "a hot pair was sent"
        np.testing.assert_array_equal(hot[res.hot_position[res.recover_index[~cold] - c]], unified[~cold])
    check_message(res, sent_keys, sent_segs, num_ranks, num_segments)


# ----------------------------------------------------------------------------------------------------------------
# Against the oracle and the chain
# ----------------------------------------------------------------------------------------------------------------

def test_reference_hand_example(ref):
    keys = np.array([10, 3, 10, 7, 10, 42, 3], np.int64)
    segs = np.array([0, 1, 0, 0, 2, 1, 1], np.int32)
    bits = key_bits(3)
    hot = np.array(sorted([(1 << bits) | 3, (0 << bits) | 7, 999]), np.int64)  # (1, 3) and (0, 7) hot; 999 no pair
    got = ref.fused_sender_hot(keys, segs, hot, 1, 3, "packed")
    # cold pairs in first-occurrence order: (0, 10), (2, 10), (1, 42); hot: (1, 3), (0, 7)
    assert got[0].tolist() == [10, (2 << bits) | 10, (1 << bits) | 42]
    assert got[2].tolist() == [0, 3, 0, 4, 1, 2, 3]
    assert got[3].tolist() == [1, 1, 1]
    assert got[4].tolist() == [hot.tolist().index((1 << bits) | 3), hot.tolist().index(7)]
    assert got[5].tolist() == [3]  # one feature of all 7 positions: (1, 3) twice and (0, 7) once are hot
    sized = ref.fused_sender_hot(keys, segs, hot, 1, 3, "packed", feature_sizes=[2, 0, 5])
    assert sized[5].tolist() == [1, 0, 2]


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_hand_example(fro, ref, run, check, wire, dtype):
    keys = np.array([10, 3, 10, 7, 10, 42, 3], dtype)
    segs = np.array([0, 1, 0, 0, 2, 1, 1], np.int32)
    unified = unified_of(ref, keys, segs, 3, wire)  # (0,10) (1,3) (0,7) (2,10) (1,42)
    hot = np.sort(unified[[1, 2]])
    got = check_all(fro, ref, run, check, keys, segs, hot, 3, 3, wire)
    assert got.message.shape[0] == 3 and got.hot_position.shape == (2,) and got.segment_counts.tolist() == [1, 1, 1]


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("num_ranks", RANKS)
@pytest.mark.parametrize("n,num_segments,fraction", [(500, 1, 0.3), (26 * 2048, 26, 0.05), (3_000, 100, 0.5),
                                                       (70_000, 26, 0.2)])
def test_random(fro, ref, run, check, gen, wire, num_ranks, n, num_segments, fraction):
    rng = np.random.default_rng([n, num_segments, num_ranks, len(wire)])
    limit = 1 << key_bits(num_segments) if wire == "packed" else None
    keys = gen.make_keys(rng, n, np.int64, "zipf", nonneg_limit=limit)
    segs = gen.make_segments(rng, n, num_segments, True)
    hot = hot_set_of(ref, rng, keys, segs, num_segments, wire, fraction)
    got = check_all(fro, ref, run, check, keys, segs, hot, num_ranks, num_segments, wire)
    assert 0 < got.hot_position.shape[0] < got.recover_index.shape[0]


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("num_ranks", [1, 3])
def test_empty_hot_set_is_fused_sender(fro, ref, run, check, gen, wire, num_ranks):
    rng = np.random.default_rng(7)
    keys = gen.make_keys(rng, 4_000, np.int64, "zipf", nonneg_limit=1 << key_bits(26) if wire == "packed" else None)
    segs = gen.make_segments(rng, 4_000, 26)
    got = check_all(fro, ref, run, check, keys, segs, np.zeros([0], np.int64), num_ranks, 26, wire)
    plain = run(lambda k, s: fro.fused_sender(k, s, num_ranks, 26, wire=wire), keys, segs)
    check.assert_same(got, plain, fields=range(4))
    assert got.hot_position.shape == (0,)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("case", ["all_hot", "no_input", "one_pair_hot", "strangers_only"])
def test_edge_cases(fro, ref, run, check, wire, case):
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 300, 2_000).astype(np.int64)
    segs = rng.integers(0, 5, 2_000).astype(np.int32)
    if case == "no_input":
        keys, segs = keys[:0], segs[:0]
    unified = unified_of(ref, keys, segs, 5, wire)
    hot = {"all_hot": np.sort(unified), "no_input": np.array([1, 5, 9], np.int64),
           "one_pair_hot": np.sort(unified[:1]),
           "strangers_only": hot_set_of(ref, rng, keys, segs, 5, wire, 0.0, strangers=50)}[case]
    got = check_all(fro, ref, run, check, keys, segs, hot, 3, 5, wire)
    if case == "all_hot":
        assert got.message.shape[0] == 0 and got.splits.tolist() == [0, 0, 0]
        assert got.hot_position.shape[0] == unified.size
    if case == "strangers_only":
        assert got.hot_position.shape[0] == 0


@pytest.mark.parametrize("threads", [1, 4])
def test_session_mode_large(fro, ref, gen, check, session_run, threads):
    """Above the dedup's sharded threshold (4 pool threads): the result does not depend on threads."""
    keys, segs = large_input(gen)
    rng = np.random.default_rng(14)
    for wire in WIRES:
        hot = hot_set_of(ref, rng, keys[:50_000], segs[:50_000], 26, wire, 0.1)
        sizes = feature_sizes_of(rng, keys.shape[0], features=26)
        want = ref.fused_sender_hot(keys, segs, hot, 3, 26, wire, sizes)
        check.assert_same(session_run(sender(fro, 3, 26, wire), keys, segs, hot, sizes, intra_op_threads=threads),
                          want, fields=range(6))


def test_static_shapes_and_no_gradient(fro):
    from tensorflow.python.framework import ops as tf_ops  # noqa: PLC0415  (the gradient registry)

    f = tf.function(sender(fro, 3, 26, "pair"), autograph=False)
    out = f.get_concrete_function(tf.TensorSpec([7], tf.int64), tf.TensorSpec([7], tf.int32),
                                  tf.TensorSpec([None], tf.int64), tf.TensorSpec([4], tf.int32)).structured_outputs
    assert out.message.shape.as_list() == [None, 2] and out.splits.shape.as_list() == [3]
    assert out.recover_index.shape.as_list() == [7] and out.segment_counts.shape.as_list() == [26]
    assert out.hot_position.dtype == tf.int32 and out.hot_position.shape.as_list() == [None]
    assert out.hot_hits.dtype == tf.int64 and out.hot_hits.shape.as_list() == [4]
    with tf.Graph().as_default():
        out = fro.fused_sender_hot(tf.constant([1, 2], tf.int64), tf.constant([0, 1], tf.int32),
                                   tf.constant([5], tf.int64), 2, 2)
        assert out.message.op.type == "FusedRec>FusedSenderHot"
        assert tf_ops.get_gradient_function(out.message.op) is None
        assert out.hot_hits.shape.as_list() == [1]  # no feature_sizes: one feature of every position


# ----------------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("hot,where", [([5, 3, 9], "hot_keys\\[0\\] = 5, hot_keys\\[1\\] = 3"),
                                       ([1, 4, 4], "hot_keys\\[1\\] = 4, hot_keys\\[2\\] = 4")])
def test_error_unsorted_hot_keys(fro, run_all, check, hot, where):
    keys, segs = np.array([1, 2, 3], np.int64), np.array([0, 0, 1], np.int32)
    check.expect_error(lambda: run_all(sender(fro, 2, 2, "packed"), keys, segs, np.array(hot, np.int64),
                                       np.array([3], np.int32)), "sorted ascending without repeats.*" + where)


def test_error_hot_keys_not_a_vector(fro, run_all, check):
    keys, segs = np.array([1, 2, 3], np.int64), np.array([0, 0, 1], np.int32)
    check.expect_error(lambda: run_all(sender(fro, 2, 2, "packed"), keys, segs, np.array([[1, 2]], np.int64),
                                       np.array([3], np.int32)),
                       r"hot_keys|rank|vector|shape")


@pytest.mark.parametrize("sizes,match", [([2, 2], "feature_sizes sum to 4 but keys has 3 positions"),
                                         ([4, -1], r"feature_sizes\[1\] = -1 is negative"),
                                         ([[3]], "feature_sizes|rank|vector|shape")])
def test_error_feature_sizes(fro, run_all, check, sizes, match):
    keys, segs = np.array([1, 2, 3], np.int64), np.array([0, 0, 1], np.int32)
    check.expect_error(lambda: run_all(sender(fro, 2, 2, "packed"), keys, segs, np.array([5], np.int64),
                                       np.array(sizes, np.int32)), match)


def test_errors_of_fused_sender_remain(fro, run_all, check):
    """A segment id out of range, an unpackable key: the fused sender's errors, named as there."""
    hot, sizes = np.array([7], np.int64), np.array([2], np.int32)
    check.expect_error(lambda: run_all(sender(fro, 2, 3, "packed"), np.array([1, 2], np.int64),
                                       np.array([0, 3], np.int32), hot, sizes),
                       r"segment_ids must be in \[0, 3\)", 3, "position 1")
    check.expect_error(lambda: run_all(sender(fro, 2, 5, "packed"), np.array([1, -4], np.int64),
                                       np.array([0, 2], np.int32), hot, sizes), r"cannot be sent packed", -4)


# ----------------------------------------------------------------------------------------------------------------
# In group_lookup: a hot FusedGroupLookup's fused sender == its chain, GroupDist for GroupDist
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["packed", "hashed"])
@pytest.mark.parametrize("num_ranks", [2, 3])
@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("hot_rows", [0, 1, 12, "all"])
def test_group_lookup_hot_senders_equal(ref, encoding, num_ranks, mode, hot_rows):
    group = make_group(encoding, [0, 1, 2, 0, 0])  # features 3 and 4 share feature 0's rows
    rng = np.random.default_rng([num_ranks, len(encoding), 0 if hot_rows == "all" else hot_rows])
    ids = [tf.constant(rng.integers(0, 40, size), tf.int64) for size in (300, 0, 1, 50, 200)]
    keys, segments, _ = gl.fuse(ids, group.feature_categories)
    unified = unified_of(ref, keys.numpy(), segments.numpy(), group.num_categories,
                         "packed" if encoding == "packed" else "pair")
    chosen = unified if hot_rows == "all" else rng.permutation(unified)[:hot_rows]
    hot_set = replication.HotSet(f"test_hot_{encoding}_{num_ranks}_{mode}_{hot_rows}")
    order = np.argsort(chosen, kind="stable")
    hot_set.assign(chosen[order], np.zeros(chosen.size, np.int64), np.zeros(chosen.size, np.int32))
    dists = {}
    for fused in (True, False):
        lookup = gl.FusedGroupLookup(group, None, LoopbackComm(num_ranks), "test", fused_sender=fused,
                                     hot=gl.HotReplica(hot_set, None))
        assert lookup._fused_hot is fused  # noqa: SLF001  (the choice under test)
        fn = lookup.input_dist if mode == "eager" else tf.function(lookup.input_dist, autograph=False)
        dists[fused] = [t.numpy() for t in fn(ids)]
    for field, a, b in zip(gl.GroupDist._fields, dists[True], dists[False]):
        assert a.dtype == b.dtype and a.shape == b.shape, field
        np.testing.assert_array_equal(a, b, err_msg=field)
    # hot_hits, independently: per feature, the positions whose pair's unified key was chosen
    unique = ref.category_unique(keys.numpy(), segments.numpy(), group.num_categories, encoding)
    is_hot = np.isin(unique.unified_keys[unique.inverse], chosen)
    sizes = [int(t.shape[0]) for t in ids]
    want = [int(part.sum()) for part in np.split(is_hot, np.cumsum(sizes)[:-1])]
    assert dict(zip(gl.GroupDist._fields, dists[True]))["hot_hits"].tolist() == want
    assert (sum(want) == 0) == (hot_rows == 0) and (hot_rows != "all" or sum(want) == sum(sizes))
