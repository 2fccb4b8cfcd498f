"""fuse_ids: a group's per-feature ids fused into one key list with each key's category, in one op.

It equals the chain the layer ran before (kept as its reference in the tests, with the NumPy one in reference.py)::

    keys = tf.concat(ids, axis=0)
    feature_sizes = tf.stack([tf.size(x, out_type=tf.int32) for x in ids])
    segments = indexing.repeat(tf.constant(categories, tf.int32), feature_sizes)

whose repeat (a row id per key and a gather of the categories) and per-feature sizes were about 0.1 ms a group in a
`fused` step (benchmarks/profiling/op_profile.py), for a copy and a fill.
"""

import tensorflow as tf

from tf_fusedrec.ops._loader import load_ops


def fuse_ids(ids, categories, name=None):
    """Concatenates a group's ids and tags each with its feature's category.

    Args:
      ids: list of N >= 1 int64 vectors (each feature's valid ids).
      categories: N ints in [0, 2^31): the category of each feature's ids.
      name: optional op name.

    Returns:
      (keys int64 [n], segments int32 [n], feature_sizes int32 [N]), n the number of ids: keys the ids in order,
      segments[j] the category of key j's feature, feature_sizes each feature's count.

    Raises:
      ValueError: no ids, or categories of another length than ids, or out of range.
      TypeError: ids not int64.
      InvalidArgumentError: an ids tensor not a vector; 2^31 ids or more.
    """
    ids, categories = list(ids), [int(c) for c in categories]
    if not ids:
        raise ValueError("fuse_ids needs at least one ids tensor")
    if len(categories) != len(ids):
        raise ValueError(f"categories must hold one category per ids tensor: {len(ids)} tensors, "
                         f"{len(categories)} categories")
    for i, c in enumerate(categories):
        if not 0 <= c < 2 ** 31:
            raise ValueError(f"categories[{i}] must be in [0, 2^31), got {c}")
    with tf.name_scope(name or "fuse_ids"):
        tensors = [tf.convert_to_tensor(x) for x in ids]
        for i, t in enumerate(tensors):
            if t.dtype != tf.int64:
                raise TypeError(f"ids[{i}] must be int64, got {t.dtype.name}")
        return tuple(load_ops().fused_rec_fuse_ids(tensors, categories=categories))


tf.no_gradient("FusedRec>FuseIds")
