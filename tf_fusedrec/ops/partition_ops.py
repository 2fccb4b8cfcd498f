"""owner_of and partition_by_owner: route keys to the rank that owns them (FusedRec step a.3, "rankwise sort").

The owner of a key is ``mix64(uint64(int64(key))) mod num_ranks`` where mix64 is the splitmix64 finalizer::

    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9; x ^= x >> 27; x *= 0x94d049bb133111eb; x ^= x >> 31

It depends on the key only, never on its category, so the same id of two categories lands on the same worker, and
every worker computes the same owner. The function is fixed: changing it would re-shard every saved table.
"""

import collections

import tensorflow as tf

from tf_fusedrec.ops._common import convert_keys, convert_segment_ids
from tf_fusedrec.ops._loader import load_ops

PartitionResult = collections.namedtuple("PartitionResult", ["keys", "segment_ids", "splits", "order"])


def owner_of(keys, num_ranks, name=None):
    """Owner rank of each key.

    Args:
      keys: int32 or int64 [N] (int32 keys are sign-extended to int64 first).
      num_ranks: Python int >= 1.
      name: optional op name.

    Returns:
      int32 [N] in [0, num_ranks).
    """
    with tf.name_scope(name or "owner_of"):
        return load_ops().fused_rec_owner_of(convert_keys(keys), num_ranks=int(num_ranks))


tf.no_gradient("FusedRec>OwnerOf")


def partition_by_owner(keys, num_ranks, segment_ids=None, name=None):
    """Stably reorders keys by owner rank, as an all-to-all wants them: rank 0's keys first, then rank 1's, ...

    Args:
      keys: int32 or int64 [N].
      num_ranks: Python int >= 1.
      segment_ids: optional int32 [N], reordered along with the keys.
      name: optional op name.

    Returns:
      PartitionResult:
        keys: keys.dtype [N], reordered.
        segment_ids: int32 [N] reordered the same way, or None if none were given.
        splits: int32 [num_ranks], the number of keys owned by each rank.
        order: int32 [N], with keys_out[j] == keys[order[j]] (stable within a rank).

    Raises:
      InvalidArgumentError: num_ranks < 1, or keys and segment_ids of different lengths or not vectors.
    """
    with tf.name_scope(name or "partition_by_owner"):
        keys = convert_keys(keys)
        segments = [] if segment_ids is None else [convert_segment_ids(segment_ids)]
        out = load_ops().fused_rec_partition_by_owner(keys, segments, num_ranks=int(num_ranks))
        out_keys, out_segments, splits, order = out
        return PartitionResult(out_keys, out_segments[0] if segments else None, splits, order)


tf.no_gradient("FusedRec>PartitionByOwner")
