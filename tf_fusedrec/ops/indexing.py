"""Row indexes of flat layouts in a handful of graph ops.

TensorFlow's `RaggedTensor.value_rowids()` and `tf.repeat` build the same answer from a sequence mask, a tile and a
boolean mask: about 40 graph ops each, and a layer has one per ragged feature and per fused group. Here the row of a
flat position j is the number of row ends at or before j: one sorted search over the row splits. Fewer ops make a
smaller step graph, which is both every user's trace time and the per-step op dispatch (issue 20).
"""

import tensorflow as tf


def rows_of(row_splits, positions=None):
    """The row b with row_splits[b] <= j < row_splits[b + 1] of each flat position j, in row_splits' dtype.

    Args:
      row_splits: int32/int64 [B + 1], non-decreasing, starting at 0 (a ragged tensor's row splits).
      positions: int32/int64 [n] flat positions in [0, row_splits[-1]); None: every position, in order (then the
        result is `value_rowids()` of a ragged tensor with these splits).
    """
    row_splits = tf.convert_to_tensor(row_splits)
    if positions is None:
        positions = tf.range(row_splits[-1], dtype=row_splits.dtype)
    else:
        positions = tf.cast(positions, row_splits.dtype)
    # tf.searchsorted(ends, positions, side="right") without its reshapes of 1-D inputs (24 ops against 11 here).
    found = tf.raw_ops.UpperBound(sorted_inputs=tf.expand_dims(row_splits[1:], 0), values=tf.expand_dims(positions, 0),
                                  out_type=row_splits.dtype)
    return tf.reshape(found, [-1])


def repeat(values, counts, row_ids=None):
    """tf.repeat(values, counts) for 1-D values and counts (counts >= 0, int32/int64): values[i], counts[i] times.

    row_ids: the function that finds each position's row from the row splits (rows_of's signature); None: rows_of.
    The layer passes ops.row_ids (one pass, the same answer)."""
    counts = tf.convert_to_tensor(counts)
    splits = tf.concat([tf.zeros([1], counts.dtype), tf.cumsum(counts)], axis=0)
    return tf.gather(values, (row_ids or rows_of)(splits))


def true_positions(mask):
    """int64 [k]: the positions of the True entries of a 1-D bool mask, in order.

    With tf.gather, what tf.boolean_mask does for a 1-D mask in 4 graph ops instead of its 27 (shape checks and
    reshapes written for masks of any rank); one position vector serves every tensor masked alike.
    """
    return tf.reshape(tf.where(mask), [-1])


def masked(mask, *tensors):
    """tf.boolean_mask(t, mask) for each tensor t (same first dimension as the 1-D bool mask; None stays None),
    through one true_positions(mask). Returns one tensor for one tensor given, else a tuple."""
    positions = true_positions(mask)
    out = tuple(None if t is None else tf.gather(t, positions) for t in tensors)
    return out[0] if len(out) == 1 else out
