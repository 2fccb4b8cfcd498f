"""The distributed fused lookup of one spec group (FusedRec Algorithm 1, shared/DESIGN.md), in three stages.

* input dist:  fuse -> segment unique -> partition by owner -> keys all-to-all (ids and categories in one tensor)
* lookup:      category-aware unique (deferred hashing) -> table lookup -> gather to received order
* output dist: embeddings all-to-all -> recover the fused layout with one composed index -> split per feature

With one worker the all-to-alls and the partition are skipped; the result is the same as with N workers.
Two ablations for the benchmark: ``dedup="none"`` sends duplicates (the owner still deduplicates) and
``fusion="source_hash"`` hashes the category into the key before sending (the paper's "TFRA-fused"): one unique on
the sender, owner chosen from the fused key, and the owner no longer sees categories.
"""

import collections

import tensorflow as tf

from tf_fusedrec import ops

InputDist = collections.namedtuple(
    "InputDist", ["received", "received_splits", "recover_index", "feature_sizes", "unique_sent"]
)
Lookup = collections.namedtuple("Lookup", ["embeddings", "unique_looked_up"])


def input_dist(group, ids_per_feature, comm, prefix, dedup="segment", fusion="deferred"):
    """Fuses the group's ids and sends each unique (category, id) pair to its owner.

    Args:
      group: SpecGroup.
      ids_per_feature: list of int64 [n_f] valid ids, in group order.
      comm: comm backend (rank, size, alltoall).
      prefix: deterministic collective name prefix.

    Returns:
      InputDist: received int64 [m, 2] (id, category) or [m, 1] (fused key, source_hash); received_splits int32
      [N]; recover_index int32 [n] (I_r: fused position -> position in the send buffer); feature_sizes int32 [M];
      unique_sent int64 [M] unique pairs sent per category.
    """
    num_categories = group.num_categories
    with tf.name_scope("fuse"):
        keys = tf.concat(ids_per_feature, axis=0)
        feature_sizes = tf.stack([tf.size(ids, out_type=tf.int32) for ids in ids_per_feature])
        segments = tf.repeat(tf.range(num_categories, dtype=tf.int32), feature_sizes)
    if fusion == "source_hash":
        fused = ops.category_unique(keys, segments, num_categories, group.encoding, name="source_hash_unique")
        unique_keys, unique_segments, inverse = fused.unified_keys, fused.unique_segment_ids, fused.inverse
        owner_keys, payload_columns = unique_keys, [unique_keys]
    else:
        if dedup == "segment":
            unique = ops.segment_unique(keys, segments)
            unique_keys, unique_segments, inverse = unique.unique_keys, unique.unique_segment_ids, unique.inverse
        else:
            unique_keys, unique_segments = keys, segments
            inverse = tf.range(tf.size(keys, out_type=tf.int32))
        owner_keys, payload_columns = unique_keys, [unique_keys, tf.cast(unique_segments, tf.int64)]
    unique_sent = tf.math.bincount(unique_segments, minlength=num_categories, maxlength=num_categories, dtype=tf.int64)

    payload = tf.stack(payload_columns, axis=1)
    if comm.size == 1:
        splits = tf.size(unique_keys, out_type=tf.int32)[None]
        return InputDist(payload, splits, inverse, feature_sizes, unique_sent)
    part = ops.partition_by_owner(owner_keys, comm.size, name="partition")
    payload = tf.gather(payload, part.order)
    # I_r = I_s after I_u: where each fused position's unique pair sits in the send buffer.
    recover_index = tf.gather(tf.math.invert_permutation(part.order), inverse)
    received, received_splits = comm.alltoall(payload, part.splits, name=f"{prefix}/keys")
    return InputDist(received, received_splits, recover_index, feature_sizes, unique_sent)


@tf.custom_gradient
def _gather_rows(rows, index):
    """tf.gather whose gradient sums duplicates into a dense [U, dim]: the optimizer sees each row once."""

    def grad(upstream):
        return tf.math.unsorted_segment_sum(upstream, index, tf.shape(rows)[0]), None

    return tf.gather(rows, index), grad


def lookup(group, received, table, training, fusion="deferred"):
    """On the owner: unique over the received pairs from all peers, table lookup, gather to received order.

    Returns:
      Lookup: embeddings float [m, dim]; unique_looked_up int64 [M] (unique pairs per category looked up here, -1
      for source_hash where categories are gone).
    """
    if fusion == "source_hash":
        unified, inverse = tf.unique(received[:, 0], out_idx=tf.int32)
        categories = ids = None
        if group.encoding == "packed":
            # Packed keys still carry the category, so new rows start where the other modes' do. Hashed keys do not:
            # their initial rows come from the fused key itself (deterministic, but not the per-feature rows).
            categories, ids = ops.decode_unified_keys(unified, group.num_categories)
        rows = table.lookup(unified, categories, ids, training)
        unknown = tf.fill([group.num_categories], tf.constant(-1, tf.int64))
        return Lookup(_gather_rows(rows, inverse), unknown)
    ids = received[:, 0]
    categories = tf.cast(received[:, 1], tf.int32)
    unique = ops.category_unique(ids, categories, group.num_categories, group.encoding, name="category_unique")
    unique_ids = tf.math.unsorted_segment_max(ids, unique.inverse, tf.size(unique.unified_keys))
    rows = table.lookup(unique.unified_keys, unique.unique_segment_ids, unique_ids, training)
    return Lookup(_gather_rows(rows, unique.inverse), tf.cast(unique.segment_counts, tf.int64))


def output_dist(embeddings, dist, comm, prefix, num_categories):
    """Sends rows back to the requesting workers and rebuilds the fused layout, split per feature.

    Returns:
      list of float [n_f, dim], one per feature in group order.
    """
    if comm.size > 1:
        embeddings, _ = comm.alltoall(embeddings, dist.received_splits, name=f"{prefix}/embeddings")
    fused = tf.gather(embeddings, dist.recover_index)
    return tf.split(fused, dist.feature_sizes, num=num_categories, axis=0)
