"""fused_sender: the sender side of a group lookup as one op (fuse's output -> keys all-to-all's input).

It equals, output for output, the op chain it replaces (kept as its reference and tested against it)::

    unique = segment_unique(keys, segment_ids)
    part = partition_by_owner(unique.unique_keys, num_ranks, segment_ids=unique.unique_segment_ids)
    message = encode(part.keys, part.segment_ids)            # the wire: packed or (id, segment) pairs
    splits = part.splits
    recover_index = gather(invert_permutation(part.order), unique.inverse)
    segment_counts = bincount(unique.unique_segment_ids, minlength=num_segments)

in one pass over the fused keys and one over the unique pairs, without the intermediate tensors.
"""

import collections

import tensorflow as tf

from tf_fusedrec.ops._common import convert_keys, convert_segment_ids
from tf_fusedrec.ops._loader import load_ops

WIRES = ("packed", "pair")

FusedSenderResult = collections.namedtuple(
    "FusedSenderResult", ["message", "splits", "recover_index", "segment_counts"]
)
FusedSenderHotResult = collections.namedtuple(
    "FusedSenderHotResult", ["message", "splits", "recover_index", "segment_counts", "hot_position", "hot_hits"]
)


def fused_sender(keys, segment_ids, num_ranks, num_segments, wire="packed", name=None):
    """Unique (segment, key) pairs of a fused group, partitioned by owner rank and encoded for the keys all-to-all.

    Args:
      keys: int32 or int64 [N], the fused keys of a group (int32 keys are sign-extended).
      segment_ids: int32 [N] in [0, num_segments), the category of each key.
      num_ranks: Python int >= 1, the number of workers; a key's owner is owner_of(key, num_ranks).
      num_segments: Python int >= 1, the number of categories of the group.
      wire: "packed" (one int64 per pair: (segment << packed_key_bits(num_segments)) | key, keys in
        [0, 2**packed_key_bits(num_segments))) or "pair" (an int64 [2] row: key, segment; any key).
      name: optional op name.

    Returns:
      FusedSenderResult:
        message: int64 [U] (packed) or [U, 2] (pair): the unique pairs, rank 0's first, then rank 1's, ...; within a
          rank in first-occurrence order.
        splits: int32 [num_ranks], the number of pairs owned by each rank.
        recover_index: int32 [N], the position in message of the pair at each fused position.
        segment_counts: int64 [num_segments], the number of unique pairs of each segment.

    Raises:
      ValueError: unknown wire.
      InvalidArgumentError: a segment id outside [0, num_segments) (naming it and its position), num_ranks or
        num_segments < 1, keys and segment_ids of different lengths or not vectors, or (packed) a key that is negative
        or does not fit in packed_key_bits(num_segments) bits (naming the key and its segment).
    """
    if wire not in WIRES:
        raise ValueError(f"wire must be one of {WIRES}, got {wire!r}")
    with tf.name_scope(name or "fused_sender"):
        keys = convert_keys(keys)
        segment_ids = convert_segment_ids(segment_ids)
        out = load_ops().fused_rec_fused_sender(
            keys, segment_ids, num_ranks=int(num_ranks), num_segments=int(num_segments), wire=wire
        )
        return FusedSenderResult(*out)


tf.no_gradient("FusedRec>FusedSender")


def fused_sender_hot(keys, segment_ids, hot_keys, num_ranks, num_segments, wire="packed", feature_sizes=None,
                     name=None):
    """fused_sender for a group with a replicated hot set: the pairs of the set stay home.

    Args:
      keys, segment_ids, num_ranks, num_segments, wire, name: as fused_sender.
      hot_keys: int64 [T], the hot set's unified keys, sorted ascending without repeats: the packed word
        (segment << packed_key_bits(num_segments)) | key for wire "packed", the hashed encoding of category_unique
        for wire "pair" (the group's encoding decides both).
      feature_sizes: int32 [F], the fused positions of each feature, in order (non-negative, summing to N); None:
        one feature of all N.

    Returns:
      FusedSenderHotResult: message, splits and segment_counts as fused_sender of the cold (not hot) unique pairs;
      recover_index: int32 [N], the pair's position in message, or C + k (C = the message's pairs) for the k-th hot
      pair in first-occurrence order; hot_position: int32 [h], the position in hot_keys of each hot pair, in that
      order; hot_hits: int64 [F], each feature's positions whose pair is hot. Equal to the chain segment_unique,
      a searchsorted of the unified keys, fused_sender of the cold pairs (tf_fusedrec.ops.reference.fused_sender_hot).

    Raises:
      As fused_sender; InvalidArgumentError for hot_keys that are not a vector or not strictly ascending (naming
      the first two out of order), and for feature_sizes with a negative size or a sum other than N (naming them).
    """
    if wire not in WIRES:
        raise ValueError(f"wire must be one of {WIRES}, got {wire!r}")
    with tf.name_scope(name or "fused_sender_hot"):
        keys = convert_keys(keys)
        segment_ids = convert_segment_ids(segment_ids)
        hot_keys = tf.convert_to_tensor(hot_keys, tf.int64)
        if feature_sizes is None:
            feature_sizes = tf.reshape(tf.size(keys, out_type=tf.int32), [1])
        feature_sizes = tf.convert_to_tensor(feature_sizes, tf.int32)
        out = load_ops().fused_rec_fused_sender_hot(
            keys, segment_ids, hot_keys, feature_sizes, num_ranks=int(num_ranks), num_segments=int(num_segments),
            wire=wire
        )
        return FusedSenderHotResult(*out)


tf.no_gradient("FusedRec>FusedSenderHot")
