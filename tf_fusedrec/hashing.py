"""The hashes every part of tf_fusedrec agrees on, in NumPy and without TensorFlow.

* ``mix64``: the splitmix64 finalizer (owners, hashed keys, routing, initial rows);
* ``packed_bits``: the high bits holding the category in a packed key;
* ``hashed_rows_numpy``: ``fr.initializers.Hashed``'s initial rows.

Their one home: the ops' oracle (tf_fusedrec/ops/reference.py), the initializers and the export format, which
embedding servers read without TensorFlow, import them from here. The C++ kernels have their own twin
(cc/kernels/impl/hashing.h), which the ops' tests check against these.
"""

import numpy as np

GOLDEN = 0x9E3779B97F4A7C15
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(x):
    """The splitmix64 finalizer on a uint64 array (wrapping arithmetic). Returns np.uint64 array."""
    x = np.array(x, dtype=np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
    return x


def packed_bits(num_segments):
    """b = max(1, ceil(log2(num_segments))), the number of high bits holding the segment in packed keys."""
    num_segments = int(num_segments)
    if num_segments < 1:
        raise ValueError(f"num_segments must be >= 1, got {num_segments}")
    return max(1, (num_segments - 1).bit_length())


def hashed_rows_numpy(ids, salts, dim, stddev):
    """fr.initializers.Hashed's rows in NumPy (for embedding servers, which hold no TensorFlow graph): the same bits,
    the same Box-Muller in float64, cast to float32 last.

    Args:
      ids: int64 [n]; salts: int64 [n]; dim: int; stddev: float.

    Returns:
      float32 [n, dim].
    """
    ids = np.asarray(ids, np.int64).view(np.uint64)
    salts = np.asarray(salts, np.int64).view(np.uint64)
    base = mix64(ids ^ salts)
    with np.errstate(over="ignore"):
        columns = np.arange(1, dim + 1, dtype=np.uint64) * np.uint64(GOLDEN)
        bits = mix64(base[:, None] + columns[None, :])
    u1 = ((bits >> np.uint64(40)).astype(np.float64) + 0.5) / 2.0**24
    u2 = ((bits & np.uint64(0xFFFFFF)).astype(np.float64) + 0.5) / 2.0**24
    normal = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return (float(stddev) * normal).astype(np.float32)
