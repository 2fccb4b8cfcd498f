"""hashed_rows: the initial rows of ``fr.initializers.Hashed`` in one op.

Row i is ``stddev * N(0, 1)`` drawn from the bits of ``splitmix64(ids[i] ^ salts[i])`` (Box-Muller in float64, cast to
float32 last): ``tf_fusedrec.hashing.hashed_rows_numpy`` is its NumPy reference, and the native table's
lookup_or_init starts new keys from the same rows (one C++ initializer, cc/kernels/impl/native_table.h). Written with
TensorFlow's bitwise ops the recipe is about 40 graph ops, traced again in every step graph that inserts rows.
"""

import tensorflow as tf

from tf_fusedrec.ops._loader import load_ops


def hashed_rows(ids, salts, dim, stddev, name=None):
    """Hashed initial rows.

    Args:
      ids: int64 [N].
      salts: int64 [N], feature_salt(seed, feature) of each id's feature.
      dim: Python int >= 1.
      stddev: Python float > 0 (applied in float64).
      name: optional op name.

    Returns:
      float32 [N, dim].

    Raises:
      ValueError: dim < 1 or stddev not > 0 (Python values, checked here).
      InvalidArgumentError: ids and salts not vectors of one length.
    """
    dim, stddev = int(dim), float(stddev)
    if dim < 1:
        raise ValueError(f"hashed_rows: dim must be >= 1, got {dim}")
    if not stddev > 0:
        raise ValueError(f"hashed_rows: stddev must be > 0, got {stddev!r}")
    with tf.name_scope(name or "hashed_rows"):
        ids = tf.convert_to_tensor(ids, tf.int64)
        salts = tf.convert_to_tensor(salts, tf.int64)
        return load_ops().fused_rec_hashed_rows(ids, salts, tf.constant(stddev, tf.float64), dim=dim)


tf.no_gradient("FusedRec>HashedRows")
