"""Helpers shared by the fused senders' tests (tests/ops/test_fused_sender.py and test_fused_sender_hot.py): the
packed key width as the tests compute it (independently of the library), the message checks any correct sender
output satisfies, a large input above the dedup's sharded threshold, and a loopback comm and a group for
FusedGroupLookup."""

import types

import numpy as np
import tensorflow as tf

from tf_fusedrec.ops.reference import MASK64, mix64_int


def key_bits(num_segments):
    return 63 - max(1, (num_segments - 1).bit_length())


def check_message(res, sent_keys, sent_segs, num_ranks, num_segments):
    """The message's pairs are unique, counted per segment, and each sits in its owner's block."""
    assert len(set(zip(sent_keys.tolist(), sent_segs.tolist()))) == sent_keys.shape[0]
    np.testing.assert_array_equal(res.segment_counts, np.bincount(sent_segs, minlength=num_segments))
    bounds = np.concatenate([[0], np.cumsum(res.splits)])
    for r in range(num_ranks):
        owners = [mix64_int(int(k) & MASK64) % num_ranks for k in sent_keys[bounds[r]:bounds[r + 1]]]
        assert all(o == r for o in owners), f"rank {r}'s block holds other ranks' pairs"


def large_input(gen, num_segments=26):
    """(keys, segment ids) of gen.LARGE_N zipf pairs, above the dedup's sharded threshold, packable."""
    rng = np.random.default_rng(13)
    keys = gen.make_keys(rng, gen.LARGE_N, np.int64, "zipf", nonneg_limit=1 << key_bits(num_segments))
    return keys, gen.make_segments(rng, gen.LARGE_N, num_segments)


class LoopbackComm:
    """`size` workers' routing on one process: the all-to-all hands the send buffer back (as if every peer sent the
    same), the allreduce its input (a hot layer's touched flags, the same on every worker), which is all input_dist
    needs to compare two senders."""

    def __init__(self, size):
        self.rank, self.size = 0, size

    def alltoall(self, tensor, splits, name):  # noqa: ARG002
        return tensor, splits

    def allreduce(self, tensors, name, op):  # noqa: ARG002
        return [tf.identity(t) for t in tensors]


def make_group(encoding, feature_categories):
    names = [f"f{i}" for i in range(len(feature_categories))]
    return types.SimpleNamespace(name="g", encoding=encoding, feature_names=names,
                                 feature_categories=list(feature_categories),
                                 num_categories=max(feature_categories) + 1)
