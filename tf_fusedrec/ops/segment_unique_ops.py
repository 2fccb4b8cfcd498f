"""segment_unique: one-pass unique over (segment, key) pairs of a fused group (FusedRec step a.2)."""

import collections

import tensorflow as tf

from tf_fusedrec.ops._common import convert_keys, convert_segment_ids
from tf_fusedrec.ops._loader import load_ops

SegmentUniqueResult = collections.namedtuple(
    "SegmentUniqueResult", ["unique_keys", "unique_segment_ids", "inverse", "counts"]
)


def segment_unique(keys, segment_ids, name=None):
    """Removes duplicate keys within each segment; the same key in two segments is kept twice.

    One pass over the input with an open-addressing table pre-sized from N (no per-segment calls, no sort). Large
    inputs use the intra-op CPU thread pool; the result does not depend on the number of threads.

    Args:
      keys: int32 or int64 [N], the fused keys of a group.
      segment_ids: int32 [N], >= 0, the category index of each key inside the group.
      name: optional op name.

    Returns:
      SegmentUniqueResult with, in order of first occurrence of each (segment, key) pair:
        unique_keys: keys.dtype [U].
        unique_segment_ids: int32 [U].
        inverse: int32 [N], with unique_keys[inverse[i]] == keys[i] and
          unique_segment_ids[inverse[i]] == segment_ids[i].
        counts: int32 [U], occurrences of each pair.

    Raises:
      InvalidArgumentError: a negative segment id, or keys and segment_ids of different lengths or not vectors.
    """
    with tf.name_scope(name or "segment_unique"):
        keys = convert_keys(keys)
        segment_ids = convert_segment_ids(segment_ids)
        return SegmentUniqueResult(*load_ops().fused_rec_segment_unique(keys, segment_ids))


tf.no_gradient("FusedRec>SegmentUnique")
