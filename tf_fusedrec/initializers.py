"""Initial rows for new ids.

Besides Keras initializers (passed to TFRA as the table's default value), :class:`Hashed` makes the initial row a
function of (seed, feature, id) only, so results do not depend on the number of workers, on batch order, or on
whether the feature is fused: the fused table and a per-feature table start from the same rows.
"""

import hashlib

import tensorflow as tf

from tf_fusedrec.hashing import hashed_rows_numpy  # noqa: F401  (Hashed's rows in NumPy; its home is TF-free)


_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB


def _signed(x):
    return x - (1 << 64) if x >= 1 << 63 else x


def _shift_right_logical(x, k):
    return tf.bitwise.bitwise_and(tf.bitwise.right_shift(x, k), tf.constant((1 << (64 - k)) - 1, tf.int64))


def mix64(x):
    """splitmix64 finalizer on int64 tensors (two's-complement wrapping arithmetic, bits as uint64): the stochastic
    rounding's random bits (tf_fusedrec/distributed/rounding.py). Hashed's rows are one op (ops.hashed_rows)."""
    x = tf.bitwise.bitwise_xor(x, _shift_right_logical(x, 30))
    x = x * tf.constant(_signed(_C1), tf.int64)
    x = tf.bitwise.bitwise_xor(x, _shift_right_logical(x, 27))
    x = x * tf.constant(_signed(_C2), tf.int64)
    return tf.bitwise.bitwise_xor(x, _shift_right_logical(x, 31))


def feature_salt(seed, feature_name):
    """Stable int64 salt of (seed, feature): the same in every process and on every worker."""
    digest = hashlib.blake2b(f"{int(seed)}/{feature_name}".encode(), digest_size=8).digest()
    return _signed(int.from_bytes(digest, "little"))


class Hashed:
    """Deterministic per-key initializer: row = stddev * N(0, 1) drawn from a hash of (seed, feature, id).

    Args:
      seed: int.
      stddev: standard deviation of the entries.
    """

    def __init__(self, seed=0, stddev=0.05):
        if not isinstance(seed, int):
            raise ValueError(f"Hashed: seed must be an int, got {seed!r}")
        if not stddev > 0:
            raise ValueError(f"Hashed: stddev must be > 0, got {stddev!r}")
        self.seed = seed
        self.stddev = float(stddev)

    def rows(self, ids, salts, dim, dtype=tf.float32):
        """Initial rows (one FusedRec>HashedRows op: tf_fusedrec.ops.hashed_rows).

        Args:
          ids: int64 [n].
          salts: int64 [n], feature_salt(seed, feature) of each id's feature.
          dim: Python int.
          dtype: the rows' dtype; another than float32 is the float32 rows cast.

        Returns:
          dtype [n, dim].
        """
        from tf_fusedrec.ops.hashed_rows_ops import hashed_rows  # noqa: PLC0415  (ops load TensorFlow's op library)

        rows = hashed_rows(tf.cast(ids, tf.int64), salts, dim, self.stddev)
        return rows if dtype == tf.float32 else tf.cast(rows, dtype)

    def tfra_default(self):
        """What TFRA's table gets as initializer: the layers insert hashed rows themselves (before the lookup that
        reads them, or reading the Hashed row where a key is missing), so TFRA's default rows are never read. A
        constant, not an initializer object: TFRA runs an initializer object for the default rows of every lookup
        (the shadow's reads included), a constant becomes the table's static default with no ops per lookup."""
        return 0.0

    def spec_key(self):
        return ("Hashed", self.seed, self.stddev)

    def get_config(self):
        return {"seed": self.seed, "stddev": self.stddev}

    def __eq__(self, other):
        return isinstance(other, Hashed) and self.spec_key() == other.spec_key()

    def __hash__(self):
        return hash(self.spec_key())

    def __repr__(self):
        return f"Hashed(seed={self.seed}, stddev={self.stddev})"


def Constant(value=0.0):  # noqa: N802  (mirrors the Keras class name)
    """Every entry of a new row is `value`."""
    return tf.keras.initializers.Constant(value)


def Zeros():  # noqa: N802
    return tf.keras.initializers.Zeros()


def RandomNormal(mean=0.0, stddev=0.05, seed=None):  # noqa: N802
    """TFRA's default: random rows (not reproducible across worker counts; prefer Hashed for that)."""
    return tf.keras.initializers.RandomNormal(mean=mean, stddev=stddev, seed=seed)


def is_hashed(initializer):
    return isinstance(initializer, Hashed)


def tfra_initializer(initializer):
    """The initializer handed to TFRA's dynamic_embedding variable."""
    return initializer.tfra_default() if is_hashed(initializer) else initializer


def serialize(initializer):
    if is_hashed(initializer):
        return {"class_name": "Hashed", "config": initializer.get_config()}
    return tf.keras.initializers.serialize(initializer)


def deserialize(config):
    if isinstance(config, dict) and config.get("class_name") == "Hashed":
        return Hashed(**config["config"])
    return tf.keras.initializers.deserialize(config)


def get(identifier):
    """An initializer from an instance, a serialized dict or a Keras name ("zeros", "random_normal")."""
    if identifier is None or is_hashed(identifier) or callable(identifier):
        return identifier
    if isinstance(identifier, dict):
        return deserialize(identifier)
    return tf.keras.initializers.get(identifier)
