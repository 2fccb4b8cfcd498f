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
    "InputDist",
    ["received_ids", "received_segments", "received_splits", "recover_index", "feature_sizes", "unique_sent"],
)
Lookup = collections.namedtuple("Lookup", ["embeddings", "unique_looked_up"])


def input_dist(group, ids_per_feature, comm, prefix, dedup="segment", fusion="deferred"):
    """Fuses the group's ids and sends each unique (category, id) pair to its owner.

    The keys all-to-all carries a pair in one tensor: for a packed group as its packed key (segment << (63 - b)) | id,
    8 bytes and reversible; for a hashed group as an (id, category) row, 16 bytes. Either way the owner recovers the
    category exactly.

    Args:
      group: SpecGroup.
      ids_per_feature: list of int64 [n_f] valid ids, in group order.
      comm: comm backend (rank, size, alltoall).
      prefix: deterministic collective name prefix.

    Returns:
      InputDist: received_ids int64 [m] (fused keys for source_hash); received_segments int32 [m] (None for
      source_hash); received_splits int32 [N]; recover_index int32 [n] (I_r: fused position -> position in the send
      buffer); feature_sizes int32 [M]; unique_sent int64 [M] pairs sent per category (None with one worker and
      dedup="segment": no sender-side unique runs then, and the count is the lookup's).
    """
    num_categories = group.num_categories
    with tf.name_scope("fuse"):
        keys = tf.concat(ids_per_feature, axis=0)
        feature_sizes = tf.stack([tf.size(ids, out_type=tf.int32) for ids in ids_per_feature])
        segments = tf.repeat(tf.range(num_categories, dtype=tf.int32), feature_sizes)
    if fusion == "source_hash":
        fused = ops.category_unique(keys, segments, num_categories, group.encoding, name="source_hash_unique")
        unique_keys, unique_segments, inverse = fused.unified_keys, fused.unique_segment_ids, fused.inverse
    elif dedup == "segment" and comm.size > 1:
        unique = ops.segment_unique(keys, segments)
        unique_keys, unique_segments, inverse = unique.unique_keys, unique.unique_segment_ids, unique.inverse
    else:
        # Nothing to save by deduplicating before a send (dedup="none", or one worker, where the lookup's
        # category_unique is the only unique the pairs need).
        unique_keys, unique_segments = keys, segments
        inverse = tf.range(tf.size(keys, out_type=tf.int32))
    if fusion != "source_hash" and dedup == "segment" and comm.size == 1:
        unique_sent = None  # the lookup's per-category unique counts, filled in by the layer
    else:
        unique_sent = tf.math.bincount(unique_segments, minlength=num_categories, maxlength=num_categories,
                                       dtype=tf.int64)
    sent_segments = None if fusion == "source_hash" else unique_segments

    if comm.size == 1:
        splits = tf.size(unique_keys, out_type=tf.int32)[None]
        return InputDist(unique_keys, sent_segments, splits, inverse, feature_sizes, unique_sent)
    part = ops.partition_by_owner(unique_keys, comm.size, segment_ids=sent_segments, name="partition")
    # I_r = I_s after I_u: where each fused position's unique pair sits in the send buffer.
    recover_index = tf.gather(tf.math.invert_permutation(part.order), inverse)
    name = f"{prefix}/keys"
    if fusion == "source_hash":
        received, received_splits = comm.alltoall(part.keys, part.splits, name=name)
        return InputDist(received, None, received_splits, recover_index, feature_sizes, unique_sent)
    if group.encoding == "packed":
        key_bits = ops.packed_key_bits(num_categories)
        packed = tf.bitwise.bitwise_or(tf.bitwise.left_shift(tf.cast(part.segment_ids, tf.int64), key_bits), part.keys)
        received, received_splits = comm.alltoall(packed, part.splits, name=name)
        received_segments, received_ids = ops.decode_unified_keys(received, num_categories)
    else:
        pairs = tf.stack([part.keys, tf.cast(part.segment_ids, tf.int64)], axis=1)
        received, received_splits = comm.alltoall(pairs, part.splits, name=name)
        received_ids, received_segments = received[:, 0], tf.cast(received[:, 1], tf.int32)
    return InputDist(received_ids, received_segments, received_splits, recover_index, feature_sizes, unique_sent)


@tf.custom_gradient
def _gather_rows(rows, index):
    """tf.gather whose gradient sums duplicates into a dense [U, dim]: the optimizer sees each row once."""

    def grad(upstream):
        return tf.math.unsorted_segment_sum(upstream, index, tf.shape(rows)[0]), None

    return tf.gather(rows, index), grad


def lookup(group, dist, table, training, fusion="deferred"):
    """On the owner: unique over the received pairs from all peers, table lookup, gather to received order.

    Returns:
      Lookup: embeddings float [m, dim]; unique_looked_up int64 [M] (unique pairs per category looked up here, -1
      for source_hash where categories are gone).
    """
    if fusion == "source_hash":
        unified, inverse = tf.unique(dist.received_ids, out_idx=tf.int32)
        categories = ids = None
        if group.encoding == "packed":
            # Packed keys still carry the category, so new rows start where the other modes' do. Hashed keys do not:
            # their initial rows come from the fused key itself (deterministic, but not the per-feature rows).
            categories, ids = ops.decode_unified_keys(unified, group.num_categories)
        rows = table.lookup(unified, categories, ids, training)
        unknown = tf.fill([group.num_categories], tf.constant(-1, tf.int64))
        return Lookup(_gather_rows(rows, inverse), unknown)
    ids, categories = dist.received_ids, dist.received_segments
    unique = ops.category_unique(ids, categories, group.num_categories, group.encoding, name="category_unique")
    unique_ids = None  # the id of each unique pair: only Hashed initial rows need it
    if table.hashed and group.encoding == "packed":
        _, unique_ids = ops.decode_unified_keys(unique.unified_keys, group.num_categories)
    elif table.hashed:
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
