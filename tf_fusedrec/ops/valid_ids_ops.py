"""valid_ids and id_extremes: the layer's input preparation over all of a layer's features in one op each.

They equal, feature by feature, the chains the layer ran before (kept as their reference in the tests, with the NumPy
ones in reference.py)::

    positions = tf.reshape(tf.where(ids >= 0), [-1]); valid = tf.gather(tf.reshape(ids, [-1]), positions)
    lows = tf.stack([tf.reduce_min(x) for x in ids]); highs = tf.stack([tf.reduce_max(x) for x in ids])

which were about six executor nodes per feature (GreaterEqual, Where, Reshape, GatherV2, Min, Max) for a pass over a
few thousand ids each: 26 features made them about 160 of a one-worker `fused` step's nodes and its largest gather
time (benchmarks/profiling/op_profile.py).
"""

import tensorflow as tf

from tf_fusedrec.ops._loader import load_ops


def _int64_tensors(ids, what):
    tensors = [tf.convert_to_tensor(x) for x in ids]
    if not tensors:
        raise ValueError(f"{what} needs at least one ids tensor")
    for i, t in enumerate(tensors):
        if t.dtype != tf.int64:
            raise TypeError(f"ids[{i}] must be int64, got {t.dtype.name}")
    return tensors


def valid_ids(ids, name=None):
    """The ids >= 0 of each of N features and their flat positions (-1, or any negative id, is dropped).

    Args:
      ids: list of N >= 1 int64 tensors of any shape (each read flat, in row-major order).
      name: optional op name.

    Returns:
      (valid, positions): lists of N int64 vectors; valid[i] the ids >= 0 of ids[i] in order, positions[i] their
      positions in the flattened ids[i].

    Raises:
      ValueError: no ids. TypeError: ids not int64.
    """
    with tf.name_scope(name or "valid_ids"):
        tensors = _int64_tensors(ids, "valid_ids")
        valid, positions = load_ops().fused_rec_valid_ids(tensors)
        return list(valid), list(positions)


def id_extremes(ids, name=None):
    """The smallest and the largest id of each of N features.

    Args:
      ids: list of N >= 1 int64 tensors of any shape.
      name: optional op name.

    Returns:
      (lows int64 [N], highs int64 [N]): Min and Max of each ids[i] over all its elements; for an empty one int64's
      largest value and its smallest (as tf.reduce_min / tf.reduce_max give).

    Raises:
      ValueError: no ids. TypeError: ids not int64.
    """
    with tf.name_scope(name or "id_extremes"):
        return tuple(load_ops().fused_rec_id_extremes(_int64_tensors(ids, "id_extremes")))


tf.no_gradient("FusedRec>ValidIds")
tf.no_gradient("FusedRec>IdExtremes")
