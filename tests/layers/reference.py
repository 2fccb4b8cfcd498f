"""NumPy references for the layer tests, written from the documented formulas (not from the library's code).

* ``mix64`` / ``hashed_rows`` / ``feature_salt``: fr.initializers.Hashed and its per-feature salt.
* ``unified_keys``: the table key of (category, id) in a group (README, "Encodings of category_unique").
* ``embed``: one feature's expected output from its initial (or current) rows: ids [B] -> [B, dim]; [B, L] with -1
  padding -> [B, L, dim] (zeros at padding) or [B, dim] with a combiner; ragged (a list of lists) -> a list of
  [len, dim] arrays or [B, dim]. Padding and empty rows contribute nothing; an empty row combines to zeros.
* ``row_gradients``: d loss / d row of every id for loss = sum(output * W), summed over occurrences.
* ``id_counts``: (non-padding ids, unique ids) of one feature's input.
"""

import hashlib

import numpy as np

from tf_fusedrec.ops import reference as ops_reference
from tf_fusedrec.ops.reference import MASK64, mix64, mix64_int, to_int64

GOLDEN = np.uint64(ops_reference.GOLDEN)


def as_u64(x):
    """int64 (or int32, sign-extended) values -> their two's-complement bits as uint64."""
    return np.asarray(x).astype(np.int64).view(np.uint64)


def feature_salt(seed, name):
    """Documented salt: blake2b-64 of "seed/name", little-endian, as a signed int64."""
    digest = hashlib.blake2b(f"{int(seed)}/{name}".encode(), digest_size=8).digest()
    return to_int64(int.from_bytes(digest, "little"))


def hashed_rows(ids, salts, dim, stddev=0.05):
    """Hashed.rows: column j = 1..dim of the row of (id, salt) is stddev * Box-Muller(bits) with
    bits = mix64(base + j * GOLDEN), base = mix64(uint64(id) ^ uint64(salt)). Returns float32 [n, dim]."""
    ids = as_u64(ids).reshape(-1)
    salts = as_u64(np.broadcast_to(np.asarray(salts, np.int64), ids.shape))
    base = mix64(ids ^ salts)
    with np.errstate(over="ignore"):
        columns = np.arange(1, dim + 1, dtype=np.uint64) * GOLDEN
        bits = mix64(base[:, None] + columns[None, :])
    u1 = ((bits >> np.uint64(40)).astype(np.float64) + 0.5) / 2.0**24
    u2 = ((bits & np.uint64(0xFFFFFF)).astype(np.float64) + 0.5) / 2.0**24
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return (stddev * z).astype(np.float32)


def hashed_row_scalar(key, salt, dim, stddev=0.05):
    """One row with Python ints and math only (a second implementation for known-answer checks)."""
    import math  # noqa: PLC0415

    base = mix64_int((key & MASK64) ^ (salt & MASK64))
    out = []
    for j in range(1, dim + 1):
        bits = mix64_int(base + j * 0x9E3779B97F4A7C15)
        u1 = ((bits >> 40) + 0.5) / 2.0**24
        u2 = ((bits & 0xFFFFFF) + 0.5) / 2.0**24
        out.append(stddev * math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2))
    return np.array(out, np.float32)


def initial_rows(feature, ids, dim, seed=0, stddev=0.05):
    """Initial rows of `feature`'s ids under Hashed(seed, stddev)."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    return hashed_rows(ids, np.full(ids.shape, feature_salt(seed, feature), np.int64), dim, stddev)


def hashed_initial(seed=0, stddev=0.05):
    """rows_fn(feature, ids [n], dim) -> [n, dim] for the Hashed initializer."""
    return lambda feature, ids, dim: initial_rows(feature, ids, dim, seed, stddev)


def constant_initial(value):
    return lambda feature, ids, dim: np.full((len(ids), dim), value, np.float32)


# --------------------------------------------------------------------------------------------------------------
# Unified keys
# --------------------------------------------------------------------------------------------------------------

def packed_segment_bits(num_segments):
    """b = max(1, ceil(log2(num_segments)))."""
    return max(1, (num_segments - 1).bit_length())


def unified_keys(ids, category, num_categories, encoding):
    """The table key of (category, id) for each id: packed (category << (63 - b)) | id, or hashed
    mix64(uint64(id) ^ mix64(uint64(category) + GOLDEN))."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    if encoding == "packed":
        shift = 63 - packed_segment_bits(num_categories)
        return np.array([(category << shift) | i for i in ids], np.int64)
    salt = mix64_int(category + 0x9E3779B97F4A7C15)
    return np.array([to_int64(mix64_int((i & MASK64) ^ salt)) for i in ids], np.int64)


# --------------------------------------------------------------------------------------------------------------
# Inputs and outputs of one feature
# --------------------------------------------------------------------------------------------------------------

def is_ragged(ids):
    return isinstance(ids, list)


def valid_ids(ids):
    """The non-padding ids of one feature's input, flattened in order."""
    flat = np.concatenate([np.asarray(r, np.int64) for r in ids]) if is_ragged(ids) and ids else (
        np.zeros([0], np.int64) if is_ragged(ids) else np.asarray(ids, np.int64).reshape(-1))
    return flat[flat != -1]


def id_counts(ids):
    """(number of non-padding ids, number of unique non-padding ids)."""
    v = valid_ids(ids)
    return int(v.size), int(np.unique(v).size)


def _combine(rows, combiner, dim):
    """rows [k, dim] of one example (padding already dropped) -> [dim]."""
    if rows.shape[0] == 0:
        return np.zeros([dim], np.float32)
    total = rows.astype(np.float64).sum(axis=0)
    if combiner == "mean":
        total /= rows.shape[0]
    elif combiner == "sqrtn":
        total /= np.sqrt(rows.shape[0])
    return total.astype(np.float32)


def embed(ids, rows_of, combiner, dim):
    """Expected output of one feature.

    Args:
      ids: np array [B] or [B, L] (-1 = padding), or a list of B lists (ragged).
      rows_of: function(ids int64 [n]) -> float32 [n, dim], the current row of each id.
      combiner: None, "sum", "mean" or "sqrtn".

    Returns:
      np [B, dim] / [B, L, dim], or for ragged input without combiner a list of B arrays [len_b, dim].
    """

    def rows(values):
        values = np.asarray(values, np.int64).reshape(-1)
        out = np.zeros([values.size, dim], np.float32)
        keep = values != -1
        if keep.any():
            out[keep] = rows_of(values[keep])
        return out, keep

    if is_ragged(ids):
        per_row = [rows(r) for r in ids]
        if combiner is None:
            return [r for r, _ in per_row]
        combined = [_combine(r[k], combiner, dim) for r, k in per_row]
        return np.stack(combined) if combined else np.zeros([0, dim], np.float32)
    ids = np.asarray(ids, np.int64)
    if ids.ndim == 1:
        out, _ = rows(ids)
        # [B]: one id per example; a combiner over one id is that id's row (padding -> zeros).
        return out
    if combiner is None:
        out, _ = rows(ids)
        return out.reshape(ids.shape + (dim,))
    result = np.zeros([ids.shape[0], dim], np.float32)
    for b in range(ids.shape[0]):
        r, k = rows(ids[b])
        result[b] = _combine(r[k], combiner, dim)
    return result


def row_gradients(ids, upstream, combiner, dim):
    """d loss / d row for loss = sum(output * upstream), summed over every occurrence of an id.

    Args:
      ids: as for `embed`.
      upstream: the weights W, shaped like the output (a list of [len_b, dim] arrays for ragged without combiner).

    Returns:
      dict id -> float64 [dim].
    """
    grads = {}

    def add(i, g):
        if i == -1:
            return
        grads[int(i)] = grads.get(int(i), np.zeros([dim])) + np.asarray(g, np.float64)

    def scale(count):
        if combiner == "mean":
            return 1.0 / count
        if combiner == "sqrtn":
            return 1.0 / np.sqrt(count)
        return 1.0

    if is_ragged(ids):
        for b, r in enumerate(ids):
            if combiner is None:
                for pos, i in enumerate(r):
                    add(i, upstream[b][pos])
            else:
                for i in r:
                    add(i, upstream[b] * scale(len(r)))
        return grads
    ids = np.asarray(ids, np.int64)
    if ids.ndim == 1:
        for b, i in enumerate(ids):
            add(i, upstream[b])
        return grads
    for b in range(ids.shape[0]):
        if combiner is None:
            for pos, i in enumerate(ids[b]):
                add(i, upstream[b, pos])
        else:
            count = int((ids[b] != -1).sum())
            for i in ids[b]:
                if i != -1:
                    add(i, upstream[b] * scale(count))
    return grads


# --------------------------------------------------------------------------------------------------------------
# Glue between the NumPy side and TensorFlow (shared by the layer tests)
# --------------------------------------------------------------------------------------------------------------

def to_tf(ids, dtype, row_splits_dtype="int64"):
    """A feature input as a tensor: np array -> tf.Tensor of `dtype`; list of lists -> tf.RaggedTensor [B, None]."""
    import tensorflow as tf  # noqa: PLC0415

    if is_ragged(ids):
        lengths = np.array([len(r) for r in ids], row_splits_dtype)
        values = np.concatenate([np.asarray(r, np.int64) for r in ids]) if ids else np.zeros([0], np.int64)
        return tf.RaggedTensor.from_row_lengths(tf.constant(values.astype(np.int64), dtype), tf.constant(lengths))
    return tf.constant(np.asarray(ids, np.int64), dtype)


def spec_of(t):
    """A TensorSpec / RaggedTensorSpec with every dimension unknown (runtime shapes only)."""
    import tensorflow as tf  # noqa: PLC0415

    if isinstance(t, tf.RaggedTensor):
        return tf.RaggedTensorSpec([None] * t.shape.rank, t.dtype, ragged_rank=t.ragged_rank,
                                   row_splits_dtype=t.row_splits.dtype)
    return tf.TensorSpec([None] * t.shape.rank, t.dtype)


def call_layer(layer, inputs, mode, training=None):
    """layer(inputs) eagerly or in a tf.function traced with unknown shapes; returns the raw outputs."""
    import tensorflow as tf  # noqa: PLC0415

    if mode == "eager":
        return layer(inputs, training=training)
    assert mode == "function", mode
    signature = [{k: spec_of(v) for k, v in inputs.items()}]
    key = (id(layer), training, repr(signature))
    if key not in _FUNCTIONS:  # one trace per layer and signature: shapes are unknown, so later calls reuse it
        _FUNCTIONS[key] = (layer, tf.function(lambda x: layer(x, training=training), input_signature=signature))
    return _FUNCTIONS[key][1](inputs)


_FUNCTIONS = {}


def to_numpy(out):
    """A layer output -> np array, or a list of per-row arrays for a tf.RaggedTensor."""
    import tensorflow as tf  # noqa: PLC0415

    if isinstance(out, tf.RaggedTensor):
        splits = out.row_splits.numpy()
        flat = out.flat_values.numpy()
        return [flat[splits[i]:splits[i + 1]] for i in range(len(splits) - 1)]
    return out.numpy()


def assert_close(got, want, name, atol=1e-6, rtol=1e-6):
    """Compares one feature's output (dense or per-row list) with the reference, naming the feature."""
    if isinstance(want, list):
        assert isinstance(got, list), f"{name}: expected a ragged output, got {type(got).__name__}"
        assert len(got) == len(want), f"{name}: {len(got)} rows, expected {len(want)}"
        for b, (g, w) in enumerate(zip(got, want)):
            assert g.shape == w.shape, f"{name} row {b}: shape {g.shape} != expected {w.shape}"
            np.testing.assert_allclose(g, w, atol=atol, rtol=rtol, err_msg=f"{name} row {b}")
        return
    got = np.asarray(got)
    assert got.dtype == np.float32, f"{name}: dtype {got.dtype}, expected float32"
    assert got.shape == want.shape, f"{name}: shape {got.shape} != expected {want.shape}"
    np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=name)
