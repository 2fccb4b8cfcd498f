"""row_ids: the row of each flat position of a ragged layout, in one op (indexing.repeat takes it as `row_ids`).

It equals tf_fusedrec.ops.indexing.rows_of (TensorFlow's UpperBound, a binary search per position), which stays as
its reference and is what the models use (their exported graphs hold TensorFlow's ops only). The layer's input
preparation asks for positions in order (a mask's true positions, or every position), for which the op takes one
pass over the positions and the rows instead of a search each (UpperBound was 0.4 ms of a 10 ms one-worker step,
benchmarks/profiling/op_profile.py); positions in any other order give the same answer.
"""

import tensorflow as tf

from tf_fusedrec.ops._loader import load_ops


def row_ids(row_splits, positions=None, name=None):
    """The row b with row_splits[b] <= j < row_splits[b + 1] of each flat position j, in row_splits' dtype.

    Args:
      row_splits: int32/int64 [B + 1], non-decreasing, starting at 0 (a ragged tensor's row splits).
      positions: int32/int64 [n] flat positions, fastest in non-decreasing order; None: every position, in order
        (then the result is `value_rowids()` of a ragged tensor with these splits).
      name: optional op name.

    Returns:
      row_splits' dtype [n]: for each position the number of row ends row_splits[1:] <= it (B for a position at or
      past the last end, 0 for a negative one), as indexing.rows_of.
    """
    with tf.name_scope(name or "row_ids"):
        row_splits = tf.convert_to_tensor(row_splits)
        if row_splits.dtype not in (tf.int32, tf.int64):
            raise TypeError(f"row_splits must be int32 or int64, got {row_splits.dtype.name}")
        if positions is None:
            positions = tf.range(row_splits[-1], dtype=row_splits.dtype)
        else:
            positions = tf.convert_to_tensor(positions)
            if positions.dtype not in (tf.int32, tf.int64):
                raise TypeError(f"positions must be int32 or int64, got {positions.dtype.name}")
            positions = tf.cast(positions, row_splits.dtype)
        return load_ops().fused_rec_row_ids(row_splits, positions)


tf.no_gradient("FusedRec>RowIds")
