"""category_unique: the owner-side unique over received (category, id) pairs (FusedRec step b.1).

This is where FusedRec's deferred hashing happens: the category of every key is still known here, so per-category
statistics (``segment_counts``) are exact, and only now are the pairs turned into the unified keys of the group's
table. The encoding is a static choice per group, never per batch:

* ``"packed"``: ``unified = (segment << (63 - b)) | key`` with ``b = max(1, ceil(log2(num_segments)))``. Lossless
  and reversible with :func:`decode_unified_keys`; keys must lie in ``[0, 2**(63 - b))``.
* ``"hashed"``: ``unified = mix64(uint64(key) ^ mix64(uint64(segment) + 0x9E3779B97F4A7C15))`` with mix64 the
  splitmix64 finalizer (see ``partition_ops``). For a fixed segment this is a bijection of the key, so two ids of
  one category never collide. Two pairs of different categories collide with probability 2**-64; over U pairs the
  chance of any collision is at most U**2 / 2**65 (about 3e-8 for 10^6 keys, 3e-2 for a table of 10^9 keys over
  its lifetime). Use it for id spaces that need all 64 bits (raw hashes, negative ids).
"""

import collections

import tensorflow as tf

from tf_fusedrec.ops._common import convert_keys, convert_segment_ids
from tf_fusedrec.ops._loader import load_ops

ENCODINGS = ("packed", "hashed")

CategoryUniqueResult = collections.namedtuple(
    "CategoryUniqueResult", ["unified_keys", "inverse", "unique_segment_ids", "segment_counts"]
)


def packed_segment_bits(num_segments):
    """Bits b that the packed encoding gives the segment: max(1, ceil(log2(num_segments)))."""
    if num_segments < 1:
        raise ValueError(f"num_segments must be >= 1, got {num_segments}")
    return max(1, (int(num_segments) - 1).bit_length())


def packed_key_bits(num_segments):
    """Bits left for the key in the packed encoding: 63 - b."""
    return 63 - packed_segment_bits(num_segments)


def category_unique(keys, segment_ids, num_segments, encoding="packed", name=None):
    """Unique over (segment, key) pairs received by an owner, producing one unified int64 key per pair.

    Args:
      keys: int32 or int64 [N], ids received from all peers.
      segment_ids: int32 [N] in [0, num_segments), the category index of each key.
      num_segments: Python int >= 1, the number of categories of the group.
      encoding: "packed" or "hashed" (see the module docstring), static per group.
      name: optional op name.

    Returns:
      CategoryUniqueResult, in order of first occurrence:
        unified_keys: int64 [U].
        inverse: int32 [N]; unified_keys[inverse[i]] is the unified key of pair i.
        unique_segment_ids: int32 [U].
        segment_counts: int32 [num_segments], unique pairs per segment.

    Raises:
      ValueError: unknown encoding.
      InvalidArgumentError: a segment id outside [0, num_segments), num_segments < 1, mismatched lengths, or (packed)
        a key that is negative or does not fit in 63 - b bits; the message names the segment and the key.
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    with tf.name_scope(name or "category_unique"):
        keys = convert_keys(keys)
        segment_ids = convert_segment_ids(segment_ids)
        out = load_ops().fused_rec_category_unique(
            keys, segment_ids, num_segments=int(num_segments), encoding=encoding
        )
        return CategoryUniqueResult(*out)


tf.no_gradient("FusedRec>CategoryUnique")


def decode_unified_keys(unified_keys, num_segments, name=None):
    """Inverts the packed encoding.

    Args:
      unified_keys: int64 [U], produced by category_unique(..., encoding="packed").
      num_segments: Python int >= 1, as given to category_unique.
      name: optional op name.

    Returns:
      (segment_ids int32 [U], keys int64 [U]).
    """
    with tf.name_scope(name or "decode_unified_keys"):
        unified_keys = tf.convert_to_tensor(unified_keys, dtype=tf.int64)
        key_bits = packed_key_bits(num_segments)
        segment_ids = tf.cast(tf.bitwise.right_shift(unified_keys, tf.constant(key_bits, tf.int64)), tf.int32)
        keys = tf.bitwise.bitwise_and(unified_keys, tf.constant((1 << key_bits) - 1, tf.int64))
        return segment_ids, keys
