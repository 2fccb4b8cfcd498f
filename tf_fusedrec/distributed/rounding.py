"""How a float16-storage table rounds an updated float32 row to float16 (FusedEmbedding(storage="float16", rounding=)).

* ``"nearest"`` (the default): round to nearest even, once per update. An update smaller than half a float16 step of
  the row's value is lost, every time: a row that gets many small updates stays put.
* ``"stochastic"``: |x| goes to the float16 magnitude above it with probability (|x| - below) / (above - below), else
  to the one below, so the stored row is the float32 row on average and small updates add up in expectation.

The random bits of stochastic rounding are a function of (the table's salt, the key, the update count, the column)
only: never of the worker, of the batch order or of the backend, so N workers round as one worker does, and the TFRA
backend (this module's TF ops, in EmbeddingTable.commit) rounds exactly as the native table (the C++ kernel,
cc/kernels/impl/native_table.h: StochasticFloat16Bits) does. The NumPy reference, which defines the bits, is
tf_fusedrec.ops.reference.stochastic_float16; the three are tested against each other bit for bit.

Definition (uint64 arithmetic wrapping modulo 2^64; G = 0x9E3779B97F4A7C15, K = 0x5851F42D4C957F2D):
  stream = mix64(mix64(key ^ salt ^ K) ^ mix64(update_count + G)), r_d = mix64(stream + (d + 1) G) >> 32 (32 bits);
  salt: the table's first category salt; update_count: the group optimizer's 1-based update number.
  Then with the float32 bits x of a value, its magnitude bits m = x & 0x7FFFFFFF and sign = (x >> 16) & 0x8000:
  NaN (m > 0x7F800000): sign | 0x7E00;
  m >= 0x38800000 (|value| >= 2^-14): h = min(((m << 19) + r_d) >> 32 - 0x1C000, 0x7C00);
  else (float16 subnormals, zero): F = floor(|value| 2^56) = s << (e' - 94) or s >> (94 - e') with e = m >> 23,
    e' = max(e, 1), s = (m & 0x7FFFFF) | (0x800000 if e else 0); h = (F + r_d) >> 32;
  result: the float16 with bits sign | h.
"""

import tensorflow as tf

from tf_fusedrec.hashing import GOLDEN
from tf_fusedrec.initializers import _signed, mix64  # noqa: PLC2701  (the int64 hash twins: one home)

ROUNDINGS = ("nearest", "stochastic")
SALT = 0x5851F42D4C957F2D  # keeps the rounding stream apart from the random initializers' (native_table.h)


def _int64(value):
    return tf.constant(value, tf.int64)


def check_rounding(rounding, owner):
    if rounding not in ROUNDINGS:
        raise ValueError(f"{owner}: rounding must be one of {ROUNDINGS}, got {rounding!r}")
    return rounding


class NearestRounding:
    """Round to nearest even (TF's cast)."""

    name = "nearest"

    def to_float16(self, rows, keys, update_count):  # noqa: ARG002  (no randomness)
        return tf.cast(rows, tf.float16)


class StochasticRounding:
    """Stochastic rounding with random bits of (salt, key, update count, column) (module docstring).

    Args:
      salt: int64, the table's salt (its first category's feature_salt).
    """

    name = "stochastic"

    def __init__(self, salt):
        self.salt = int(salt)

    def random_bits(self, keys, update_count, dim):
        """int64 [K, dim] in [0, 2^32): r_d of each key's row at update update_count (an int64 scalar, or [K]: one
        per key)."""
        keys = tf.convert_to_tensor(keys, tf.int64)
        count = tf.cast(tf.convert_to_tensor(update_count, dtype_hint=tf.int64), tf.int64)
        salted = tf.bitwise.bitwise_xor(keys, _int64(_signed((self.salt & (2**64 - 1)) ^ SALT)))
        stream = mix64(tf.bitwise.bitwise_xor(mix64(salted), mix64(count + _int64(_signed(GOLDEN)))))
        columns = tf.range(1, tf.cast(dim, tf.int64) + 1, dtype=tf.int64) * _int64(_signed(GOLDEN))
        words = mix64(stream[:, None] + columns[None, :])
        return tf.bitwise.bitwise_and(tf.bitwise.right_shift(words, 32), _int64(0xFFFFFFFF))

    def to_float16(self, rows, keys, update_count):
        """float16 [K, dim] of float32 rows [K, dim] of keys int64 [K] at update update_count."""
        rows = tf.convert_to_tensor(rows, tf.float32)
        dim = rows.shape[-1] if rows.shape[-1] is not None else tf.shape(rows)[-1]
        return stochastic_float16(rows, self.random_bits(keys, update_count, dim))


def stochastic_float16(values, random_bits):
    """float16 of float32 `values` rounded stochastically with `random_bits` (int64 in [0, 2^32), same shape): the
    module docstring's integer definition in int64 TF ops (every intermediate is below 2^51)."""
    b = tf.bitwise
    x = tf.cast(tf.bitcast(tf.convert_to_tensor(values, tf.float32), tf.uint32), tf.int64)
    r = tf.convert_to_tensor(random_bits, tf.int64)
    sign = b.bitwise_and(b.right_shift(x, _int64(16)), _int64(0x8000))
    m = b.bitwise_and(x, _int64(0x7FFFFFFF))
    normal = tf.minimum(b.right_shift(b.left_shift(m, _int64(19)) + r, _int64(32)) - _int64(0x1C000), _int64(0x7C00))
    e = b.right_shift(m, _int64(23))
    implicit = tf.where(e > 0, _int64(0x800000), _int64(0))
    significand = b.bitwise_or(b.bitwise_and(m, _int64(0x7FFFFF)), implicit)
    shift = tf.maximum(e, _int64(1)) - _int64(94)
    fixed = tf.where(shift >= 0, b.left_shift(significand, tf.maximum(shift, _int64(0))),
                     b.right_shift(significand, tf.minimum(-shift, _int64(63))))
    subnormal = b.right_shift(fixed + r, _int64(32))
    nan = tf.fill(tf.shape(m), _int64(0x7E00))
    h = tf.where(m > _int64(0x7F800000), nan, tf.where(m >= _int64(0x38800000), normal, subnormal))
    return tf.bitcast(tf.cast(b.bitwise_or(h, sign), tf.uint16), tf.float16)


def make_rounding(rounding, salt):
    """The rounding object of a table: NearestRounding, or StochasticRounding(salt)."""
    return StochasticRounding(salt) if check_rounding(rounding, "table") == "stochastic" else NearestRounding()
