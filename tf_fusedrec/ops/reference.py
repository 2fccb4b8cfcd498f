"""Pure NumPy reference implementations of the tf_fusedrec custom ops: the test oracle.

Every function here mirrors one op of ``tf_fusedrec.ops`` (same arguments, same outputs, same order of
outputs) but is written to be obviously correct rather than fast: dictionaries and loops in first-occurrence
order, ``np.argsort(kind="stable")`` for the partition, and ``np.uint64`` arithmetic (which wraps modulo 2**64)
for the hash. It does not use TensorFlow or the compiled library, so the tests can compare the C++ kernels
against it exactly, element by element and in order.

Errors are raised as ``ValueError`` with a message naming the offending value.
"""

from __future__ import annotations

import collections

import numpy as np

from tf_fusedrec.hashing import GOLDEN, mix64, packed_bits

__all__ = [
    "mix64",
    "owner_of",
    "segment_unique",
    "partition_by_owner",
    "category_unique",
    "decode_unified_keys",
    "fused_sender",
    "fused_sender_hot",
    "packed_bits",
    "float16_rounding_bits",
    "stochastic_float16",
    "SegmentUniqueResult",
    "PartitionResult",
    "CategoryUniqueResult",
    "FusedSenderResult",
]

SegmentUniqueResult = collections.namedtuple(
    "SegmentUniqueResult", ["unique_keys", "unique_segment_ids", "inverse", "counts"])
PartitionResult = collections.namedtuple("PartitionResult", ["keys", "segment_ids", "splits", "order"])
CategoryUniqueResult = collections.namedtuple(
    "CategoryUniqueResult", ["unified_keys", "inverse", "unique_segment_ids", "segment_counts"])
FusedSenderResult = collections.namedtuple(
    "FusedSenderResult", ["message", "splits", "recover_index", "segment_counts"])

_GOLDEN = np.uint64(GOLDEN)


def _as_key_array(keys):
    keys = np.asarray(keys)
    if keys.ndim != 1:
        raise ValueError(f"keys must be rank 1, got rank {keys.ndim}")
    if keys.dtype not in (np.int32, np.int64):
        raise ValueError(f"keys must be int32 or int64, got {keys.dtype}")
    return keys


def _as_segment_array(segment_ids, n):
    segment_ids = np.asarray(segment_ids)
    if segment_ids.ndim != 1:
        raise ValueError(f"segment_ids must be rank 1, got rank {segment_ids.ndim}")
    if segment_ids.shape[0] != n:
        raise ValueError(f"keys and segment_ids must have the same length, got {n} and {segment_ids.shape[0]}")
    if segment_ids.size and segment_ids.min() < 0:
        raise ValueError(f"negative segment id {int(segment_ids.min())}")
    return segment_ids.astype(np.int32)


def _to_uint64(keys):
    """int32/int64 keys -> uint64 bit pattern of the sign-extended int64 value."""
    return np.asarray(keys).astype(np.int64).view(np.uint64)


MASK64 = (1 << 64) - 1


def mix64_int(x):
    """mix64 on one Python int, written independently of the array version so each checks the other."""
    x &= MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    x ^= x >> 31
    return x


def to_int64(u):
    """A uint64 bit pattern held in a Python int, read as int64."""
    return u - (1 << 64) if u >= (1 << 63) else u


def owner_of(keys, num_ranks):
    """int32(mix64(uint64(int64(key))) % num_ranks) for each key."""
    keys = _as_key_array(keys)
    num_ranks = int(num_ranks)
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
    return (mix64(_to_uint64(keys)) % np.uint64(num_ranks)).astype(np.int32)


def segment_unique(keys, segment_ids):
    """Unique over (segment_id, key) pairs in first-occurrence order."""
    keys = _as_key_array(keys)
    segment_ids = _as_segment_array(segment_ids, keys.shape[0])
    index = {}  # (segment, key) -> position in the unique output
    uniq_keys, uniq_segs, counts = [], [], []
    inverse = np.empty(keys.shape[0], dtype=np.int32)
    for i, (s, k) in enumerate(zip(segment_ids.tolist(), keys.tolist())):
        j = index.get((s, k))
        if j is None:
            j = len(uniq_keys)
            index[(s, k)] = j
            uniq_keys.append(k)
            uniq_segs.append(s)
            counts.append(0)
        counts[j] += 1
        inverse[i] = j
    return SegmentUniqueResult(
        np.array(uniq_keys, dtype=keys.dtype),
        np.array(uniq_segs, dtype=np.int32),
        inverse,
        np.array(counts, dtype=np.int32),
    )


def partition_by_owner(keys, num_ranks, segment_ids=None):
    """Stable reorder of keys by owner rank; splits = per-rank counts; order = source index of each output."""
    keys = _as_key_array(keys)
    num_ranks = int(num_ranks)
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
    if segment_ids is not None:
        segment_ids = np.asarray(segment_ids)
        if segment_ids.ndim != 1 or segment_ids.shape[0] != keys.shape[0]:
            raise ValueError(
                f"keys and segment_ids must have the same length, got {keys.shape[0]} and {segment_ids.shape}")
    owners = owner_of(keys, num_ranks)
    order = np.argsort(owners, kind="stable").astype(np.int32)
    splits = np.bincount(owners, minlength=num_ranks).astype(np.int32)
    out_segs = None if segment_ids is None else segment_ids[order].astype(np.int32)
    return PartitionResult(keys[order], out_segs, splits, order)


def category_unique(keys, segment_ids, num_segments, encoding="packed"):
    """Unique (segment, key) pairs in first-occurrence order, each mapped to one int64 unified key."""
    keys = _as_key_array(keys)
    num_segments = int(num_segments)
    if num_segments < 1:
        raise ValueError(f"num_segments must be >= 1, got {num_segments}")
    if encoding not in ("packed", "hashed"):
        raise ValueError(f"unknown encoding {encoding!r}")
    segment_ids = _as_segment_array(segment_ids, keys.shape[0])
    if segment_ids.size and segment_ids.max() >= num_segments:
        raise ValueError(f"segment id {int(segment_ids.max())} >= num_segments {num_segments}")
    su = segment_unique(keys, segment_ids)
    segs = su.unique_segment_ids
    if encoding == "packed":
        shift = 63 - packed_bits(num_segments)
        k64 = su.unique_keys.astype(np.int64)
        bad = np.flatnonzero((k64 < 0) | (k64 >= (1 << shift)))
        if bad.size:
            s, k = int(segs[bad[0]]), int(k64[bad[0]])
            raise ValueError(f"key {k} in segment {s} does not fit in {shift} bits (packed encoding)")
        unified = (segs.astype(np.int64) << np.int64(shift)) | k64
    else:
        with np.errstate(over="ignore"):
            seg_mix = mix64(segs.astype(np.uint64) + _GOLDEN)
        unified = mix64(_to_uint64(su.unique_keys) ^ seg_mix).view(np.int64)
    segment_counts = np.bincount(su.unique_segment_ids, minlength=num_segments).astype(np.int32)
    return CategoryUniqueResult(unified, su.inverse, su.unique_segment_ids, segment_counts)


def decode_unified_keys(unified_keys, num_segments):
    """Inverse of the packed encoding: unified int64 keys -> (segment_ids int32, keys int64)."""
    unified_keys = np.asarray(unified_keys, dtype=np.int64)
    shift = 63 - packed_bits(num_segments)
    segs = [int(u) >> shift for u in unified_keys.tolist()]
    ks = [int(u) & ((1 << shift) - 1) for u in unified_keys.tolist()]
    return np.array(segs, dtype=np.int32), np.array(ks, dtype=np.int64)


def fused_sender(keys, segment_ids, num_ranks, num_segments, wire="packed"):
    """The sender side of a group lookup, written as the chain it fuses: segment_unique, partition_by_owner of the
    unique pairs, the wire's encoding, recover_index = (inverse permutation of the partition's order)[inverse]."""
    keys = _as_key_array(keys)
    num_ranks, num_segments = int(num_ranks), int(num_segments)
    if num_segments < 1:
        raise ValueError(f"num_segments must be >= 1, got {num_segments}")
    if wire not in ("packed", "pair"):
        raise ValueError(f"unknown wire {wire!r}")
    segment_ids = _as_segment_array(segment_ids, keys.shape[0])
    if segment_ids.size and segment_ids.max() >= num_segments:
        raise ValueError(f"segment id {int(segment_ids.max())} >= num_segments {num_segments}")
    su = segment_unique(keys, segment_ids)
    part = partition_by_owner(su.unique_keys, num_ranks, su.unique_segment_ids)
    k64, segs = part.keys.astype(np.int64), part.segment_ids.astype(np.int64)
    if wire == "packed":
        shift = 63 - packed_bits(num_segments)
        first_bad = [j for j, k in enumerate(su.unique_keys.astype(np.int64).tolist()) if not 0 <= k < (1 << shift)]
        if first_bad:
            j = first_bad[0]
            raise ValueError(f"key {int(su.unique_keys[j])} in segment {int(su.unique_segment_ids[j])} does not fit "
                             f"in {shift} bits (packed encoding)")
        message = (segs << np.int64(shift)) | k64
    else:
        message = np.stack([k64, segs], axis=1).reshape(-1, 2)
    position = np.empty(part.order.shape[0], np.int32)
    position[part.order] = np.arange(part.order.shape[0], dtype=np.int32)
    segment_counts = np.bincount(su.unique_segment_ids, minlength=num_segments).astype(np.int64)
    return FusedSenderResult(message, part.splits, position[su.inverse], segment_counts)


def fused_sender_hot(keys, segment_ids, hot_keys, num_ranks, num_segments, wire="packed", feature_sizes=None):
    """fused_sender with a replicated hot set, written as the chain it fuses (the hot layer's sender before the
    op): segment_unique, the unified key of each unique pair (category_unique's packed or hashed encoding, by the
    wire), searchsorted in hot_keys, then fused_sender's partition and encoding of the cold pairs only; the hot pairs'
    recover index is past the message, in first-occurrence order; hot_hits counts each feature's (feature_sizes;
    None: one feature) positions whose pair is hot. -> (message, splits, recover_index, segment_counts,
    hot_position, hot_hits)."""
    hot_keys = np.asarray(hot_keys, np.int64).reshape(-1)
    if hot_keys.size > 1 and not np.all(hot_keys[1:] > hot_keys[:-1]):
        raise ValueError("hot_keys must be sorted ascending without repeats")
    keys = _as_key_array(keys)
    segment_ids = _as_segment_array(segment_ids, keys.shape[0])
    su = segment_unique(keys, segment_ids)
    if su.unique_keys.size:
        unified = category_unique(su.unique_keys, su.unique_segment_ids, num_segments,
                                  "packed" if wire == "packed" else "hashed").unified_keys
    else:
        unified = np.zeros([0], np.int64)
    position = np.searchsorted(hot_keys, unified, side="left").astype(np.int32)
    is_hot = (position < hot_keys.size) & (np.append(hot_keys, 0)[position] == unified)
    cold = np.flatnonzero(~is_hot)
    sent = fused_sender(su.unique_keys[cold], su.unique_segment_ids[cold], num_ranks, num_segments, wire)
    # sent.recover_index[c] is the message position of the c-th cold pair (fused_sender of distinct pairs).
    buffer_position = np.empty(su.unique_keys.shape[0], np.int32)
    buffer_position[cold] = sent.recover_index
    buffer_position[is_hot] = sent.message.shape[0] + np.arange(int(is_hot.sum()), dtype=np.int32)
    sizes = np.asarray([keys.shape[0]] if feature_sizes is None else feature_sizes, np.int64).reshape(-1)
    if (sizes < 0).any() or sizes.sum() != keys.shape[0]:
        raise ValueError(f"feature_sizes {sizes.tolist()} must be >= 0 and sum to {keys.shape[0]}")
    hot_at_position = is_hot[su.inverse] if keys.shape[0] else np.zeros([0], bool)
    hot_hits = np.array([int(part.sum()) for part in np.split(hot_at_position, np.cumsum(sizes)[:-1])], np.int64)
    return (sent.message, sent.splits, buffer_position[su.inverse], sent.segment_counts,
            position[is_hot].astype(np.int32), hot_hits)


# ----------------------------------------------------------------------------------------------------------------
# The native embedding table (tf_fusedrec.ops.native_table_ops), as a dict.
# ----------------------------------------------------------------------------------------------------------------

__all__ += ["NativeTableReference", "native_table_initial_rows"]

# Keras 3's hyperparameters and defaults (keras/src/optimizers/*.py), written again here (native_table_ops.py has
# them for the op) so that each checks the other.
_KERAS_HYPERPARAMETERS = {
    "sgd": {"momentum": 0.0, "nesterov": False},
    "adagrad": {"initial_accumulator_value": 0.1, "epsilon": 1e-7},
    "adam": {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7},
    "adamw": {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "weight_decay": 0.004},
    "ftrl": {"learning_rate_power": -0.5, "initial_accumulator_value": 0.1, "l1_regularization_strength": 0.0,
             "l2_regularization_strength": 0.0, "l2_shrinkage_regularization_strength": 0.0, "beta": 0.0},
    "rmsprop": {"rho": 0.9, "momentum": 0.0, "epsilon": 1e-7, "centered": False},
}


def _native_table_slots(optimizer, hyper):
    """The slot names a native table keeps (native_table_ops.slot_names)."""
    if optimizer == "sgd":
        return ("momentum",) if hyper["momentum"] > 0 else ()
    if optimizer == "rmsprop":
        return ("rms",) + (("momentum",) if hyper["momentum"] > 0 else ()) + (("mg",) if hyper["centered"] else ())
    return {"adagrad": ("accumulator",), "adam": ("m", "v"), "adamw": ("m", "v"),
            "ftrl": ("accumulator", "linear")}[optimizer]


def _stream_words(base, dim, start=1, step=1):
    """mix64(base + j * golden) for j = start, start + step, ... (dim of them): uint64 [n, dim]."""
    with np.errstate(over="ignore"):
        js = (np.arange(dim, dtype=np.uint64) * np.uint64(step) + np.uint64(start)) * _GOLDEN
        return mix64(base[:, None] + js[None, :])


def _box_muller(bits):
    """N(0, 1) from the two 24-bit halves of each uint64 (cosine branch), in float64."""
    u1 = ((bits >> np.uint64(40)).astype(np.float64) + 0.5) / 2.0**24
    u2 = ((bits & np.uint64(0xFFFFFF)).astype(np.float64) + 0.5) / 2.0**24
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def native_table_initial_rows(init, ids, salts, dim, seed=0, mean=0.0, stddev=0.05, minval=-0.05, maxval=0.05,
                              value=0.0):
    """Initial rows of the native table's initializers: float32 [n, dim] for ids int64 [n] with salts int64 [n].

    "hashed" is tf_fusedrec.initializers.Hashed (written again here, independently of hashed_rows_numpy, so each
    checks the other); the random ones draw word j = column + 1 (+ k * dim for the k-th truncated-normal retry) of
    the stream mix64(mix64(id ^ salt) ^ mix64(seed + golden)).
    """
    ids = np.asarray(ids, np.int64).view(np.uint64)
    salts = np.asarray(salts, np.int64).view(np.uint64)
    n = ids.shape[0]
    if init == "constant":
        return np.full((n, dim), value, np.float32)
    if init == "hashed":
        return (float(stddev) * _box_muller(_stream_words(mix64(ids ^ salts), dim))).astype(np.float32)
    with np.errstate(over="ignore"):
        seed_mix = mix64(np.array([int(seed) & MASK64], np.uint64) + _GOLDEN)[0]
    base = mix64(mix64(ids ^ salts) ^ seed_mix)
    if init == "normal":
        return (mean + stddev * _box_muller(_stream_words(base, dim))).astype(np.float32)
    if init == "uniform":
        u = ((_stream_words(base, dim) >> np.uint64(12)).astype(np.float64) + 0.5) / 2.0**52
        # In [float32(minval), float32(maxval)): a value rounded up to float32(maxval) takes the float below it.
        below_max = max(np.float32(minval), np.nextafter(np.float32(maxval), np.float32(-np.inf)))
        return np.minimum((minval + (maxval - minval) * u).astype(np.float32), below_max)
    if init == "truncated_normal":
        z = _box_muller(_stream_words(base, dim))
        retry = 1
        while np.any(np.abs(z) > 2.0):
            again = _box_muller(_stream_words(base, dim, start=1 + retry * dim))
            z = np.where(np.abs(z) > 2.0, again, z)
            retry += 1
        return (mean + stddev * z).astype(np.float32)
    raise ValueError(f"unknown init {init!r}")


FLOAT16_ROUNDING_SALT = 0x5851F42D4C957F2D  # cc/kernels/impl/native_table.h: kFloat16RoundingSalt


def float16_rounding_bits(salt, keys, update_count, dim):
    """The random bits of stochastic rounding: uint32 [n, dim] for keys int64 [n] of a table whose first category salt
    is `salt` (int64), at the optimizer's 1-based update number `update_count`. Column d takes the high 32 bits of
    word d + 1 of the stream mix64(mix64(key ^ salt ^ FLOAT16_ROUNDING_SALT) ^ mix64(update_count + golden)), the
    random initializers' stream (native_table_initial_rows) with update_count for seed."""
    keys = np.asarray(keys, np.int64).view(np.uint64)
    salt = np.uint64((int(salt) ^ FLOAT16_ROUNDING_SALT) & MASK64)
    with np.errstate(over="ignore"):
        count_mix = mix64(np.array([int(update_count) & MASK64], np.uint64) + _GOLDEN)[0]
    stream = mix64(mix64(keys ^ salt) ^ count_mix)
    return (_stream_words(stream, dim) >> np.uint64(32)).astype(np.uint32)


def stochastic_float16(values, random_bits):
    """float32 `values` rounded to float16 stochastically with uint32 `random_bits` of the same shape.

    With s the float16 step at |v| (2^-24 below 2^-14, else 2^(floor(log2 |v|) - 10)), below = s floor(|v| / s) and
    frac = |v| / s - floor(|v| / s): |v| becomes below + s when floor(frac 2^32) + r >= 2^32, else below; so with r
    uniform the probability is frac to 32 bits, and the mean is |v|. The sign is kept (-0 stays -0); a magnitude
    past 65504 (the largest float16) is inf; NaN becomes the quiet NaN 0x7E00 with v's sign. Written in float64
    arithmetic on values, not on bits: it checks the kernel's and the TF ops' bit-level twins
    (cc/kernels/impl/native_table.h: StochasticFloat16Bits, tf_fusedrec/distributed/rounding.py).

    Returns:
      float16, the shape of values.
    """
    v = np.asarray(values, np.float32)
    r = np.asarray(random_bits, np.uint32).astype(np.float64)
    with np.errstate(invalid="ignore"):  # signalling NaNs
        v64 = v.astype(np.float64)
    a = np.abs(v64)
    finite = np.isfinite(a)
    a0 = np.where(finite, a, 0.0)
    _, exponent = np.frexp(a0)  # a0 = m 2^exponent, m in [0.5, 1): floor(log2 a0) = exponent - 1
    step = np.ldexp(1.0, np.maximum(exponent - 1, -14) - 10)
    scaled = a0 / step  # exact: a power-of-two division of a float32 value, in float64
    whole = np.floor(scaled)
    up = np.floor((scaled - whole) * 2.0**32) + r >= 2.0**32
    magnitude = (whole + up) * step
    magnitude = np.where(finite & (magnitude <= 65504.0), magnitude, np.inf)
    out = np.copysign(magnitude, np.where(np.signbit(v), -1.0, 1.0)).astype(np.float16)
    nan_bits = (np.signbit(v).astype(np.uint16) << np.uint16(15)) | np.uint16(0x7E00)
    return np.where(np.isnan(v), nan_bits.view(np.float16), out)


class NativeTableReference:
    """The native table as dicts: key -> row (float32, already rounded to float16 for float16 storage), slots
    (float32 [S, dim]) and access [count, last]. Same arguments and outputs as the op wrappers (export and
    access_status sorted by key), except apply_sparse: it takes adam's and adamw's bias-corrected learning rate
    (adam_lr) from the caller, computed as TensorFlow computes it (native_table_ops.adam_bias_corrected_lr: NumPy's
    float32 power differs from TensorFlow's in the last bit). float32 arithmetic in TF's order of operations, one key
    at a time; ftrl's x^p is np.sqrt for p = 0.5 and np.power otherwise (the kernel's std::pow may differ from it in
    the last bit)."""

    def __init__(self, dim, optimizer="sgd", slot_init=None, storage="float32", init="hashed", seed=0, mean=0.0,
                 stddev=0.05, minval=-0.05, maxval=0.05, value=0.0, salts=(0,), track_access=False,
                 rounding="nearest", hyperparameters=None):
        self.dim = int(dim)
        self.optimizer = optimizer
        self.hyper = {**_KERAS_HYPERPARAMETERS[optimizer], **dict(hyperparameters or {})}
        self.slot_names = _native_table_slots(optimizer, self.hyper)
        self.num_slots = len(self.slot_names)
        default = [self.hyper.get("initial_accumulator_value", 0.0) if n == "accumulator" else 0.0
                   for n in self.slot_names]
        self.slot_init = np.asarray(default if slot_init is None else slot_init, np.float32)
        self.float16 = storage == "float16"
        self.init_args = dict(init=init, seed=seed, mean=mean, stddev=stddev, minval=minval, maxval=maxval,
                              value=value)
        self.salts = np.asarray(salts, np.int64)
        self.track_access = track_access
        self.stochastic = rounding == "stochastic"
        self.rows, self.slots, self.access = {}, {}, {}
        self.clock = 0

    def _round(self, row):
        return row.astype(np.float16).astype(np.float32) if self.float16 else row.astype(np.float32)

    def _round_update(self, key, row, update_count):
        """An updated row as stored: rounded the table's way (stochastic: with the key's bits at update_count)."""
        if not self.stochastic:
            return self._round(row)
        bits = float16_rounding_bits(self.salts[0], [key], update_count, self.dim)[0]
        return stochastic_float16(row.astype(np.float32), bits).astype(np.float32)

    def _check_categories(self, categories):
        categories = np.asarray(categories, np.int64)
        bad = np.flatnonzero((categories < 0) | (categories >= self.salts.shape[0]))
        if bad.size:
            raise ValueError(f"category {int(categories[bad[0]])} at position {int(bad[0])} not in "
                             f"[0, {self.salts.shape[0]})")
        return categories

    def initial_rows(self, categories, ids, stored=True):
        """What a new key gets: float32 [n, dim], rounded to float16 for float16 storage when `stored` (inserted);
        unrounded otherwise (what a lookup without insert returns for a missing key)."""
        categories = self._check_categories(categories)
        rows = native_table_initial_rows(ids=ids, salts=self.salts[categories], dim=self.dim, **self.init_args)
        return self._round(rows) if stored else rows

    def _insert(self, key, row):
        self.rows[key] = row
        self.slots[key] = np.repeat(self.slot_init[:, None], self.dim, axis=1).astype(np.float32)
        self.access[key] = [0, 0]

    def lookup_or_init(self, keys, categories, ids, insert=True):
        keys = np.asarray(keys, np.int64)
        initial = self.initial_rows(categories, ids, stored=insert)
        out = np.zeros((keys.shape[0], self.dim), np.float32)
        if insert:
            self.clock += 1
        for i, k in enumerate(keys.tolist()):
            if k not in self.rows:
                if not insert:
                    out[i] = initial[i]
                    continue
                self._insert(k, initial[i].copy())
            out[i] = self.rows[k]
            if insert:
                self.access[k][0] += 1
                self.access[k][1] = self.clock
        return out

    def apply_sparse(self, keys, grads, categories, ids, lr, adam_lr=None, update_count=0, distinct_keys=False):
        keys = np.asarray(keys, np.int64)
        grads = np.asarray(grads, np.float32)
        if self.optimizer in ("adam", "adamw") and adam_lr is None:
            raise ValueError(f"{self.optimizer} needs adam_lr, the bias-corrected learning rate")
        if distinct_keys:  # the caller vouched for distinct keys: one update per occurrence, in order
            for i in range(keys.shape[0]):
                self.apply_sparse(keys[i:i + 1], grads[i:i + 1], np.asarray(categories)[i:i + 1],
                                  np.asarray(ids)[i:i + 1], lr, adam_lr, update_count)
            return
        initial = self.initial_rows(categories, ids)
        summed, first = {}, {}
        for i, k in enumerate(keys.tolist()):
            if k not in summed:
                summed[k] = np.zeros(self.dim, np.float32)
                first[k] = i
            summed[k] = summed[k] + grads[i]
        for k, g in summed.items():
            if k not in self.rows:
                self._insert(k, initial[first[k]].copy())
            w = self._update(self.rows[k].astype(np.float32), self.slots[k], g, np.float32(lr),
                             np.float32(0 if adam_lr is None else adam_lr))
            self.rows[k] = self._round_update(k, w, update_count)

    def _update(self, w, s, g, lr, adam_lr):
        """One key's update: row w float32 [dim], slots s float32 [S, dim] (updated in place), summed gradient g;
        returns the new row (float32, not rounded)."""
        h = self.hyper
        f32 = np.float32
        one = f32(1)
        eps = f32(h.get("epsilon", 0.0))
        if self.optimizer == "sgd":
            if not self.num_slots:
                return w - lr * g
            momentum = f32(h["momentum"])
            s[0] = s[0] * momentum - g * lr
            return w + (s[0] * momentum - g * lr if h["nesterov"] else s[0])
        if self.optimizer == "adagrad":
            s[0] = s[0] + g * g
            return w - lr * g / (np.sqrt(s[0]) + eps)
        if self.optimizer in ("adam", "adamw"):
            if self.optimizer == "adam":  # TensorFlow's ResourceApplyAdam (what TFRA runs): 1 - beta in float32
                c1, c2 = one - f32(h["beta_1"]), one - f32(h["beta_2"])
            else:  # Keras 3: decoupled weight decay, then 1 - beta as a Python float
                w = w - (w * f32(h["weight_decay"])) * lr
                c1, c2 = f32(1 - h["beta_1"]), f32(1 - h["beta_2"])
            s[0] = s[0] + (g - s[0]) * c1
            s[1] = s[1] + (g * g - s[1]) * c2
            return w - (s[0] * adam_lr) / (np.sqrt(s[1]) + eps)
        if self.optimizer == "ftrl":
            p = f32(-h["learning_rate_power"])
            power = np.sqrt if h["learning_rate_power"] == -0.5 else (lambda x: np.power(x, p))
            l1 = f32(h["l1_regularization_strength"])
            two_l2 = f32(2) * (f32(h["l2_regularization_strength"]) + f32(h["beta"]) / (f32(2) * lr))
            n, z = s[0], s[1]
            shrunk = g + f32(2 * h["l2_shrinkage_regularization_strength"]) * w
            n_new = n + g * g
            z[:] = z + (shrunk - ((power(n_new) - power(n)) / lr) * w)
            quadratic = power(n_new) / lr + two_l2
            w = (np.maximum(np.minimum(z, l1), -l1) - z) / quadratic
            s[0] = n_new
            return w
        # rmsprop
        rho, one_minus_rho = f32(h["rho"]), f32(1 - h["rho"])
        s[0] = rho * s[0] + one_minus_rho * (g * g)
        if h["centered"]:
            mg = s[-1]
            mg[:] = rho * mg + one_minus_rho * g
            denominator = (s[0] - mg * mg) + eps
        else:
            denominator = s[0] + eps
        step = (lr * g) / np.sqrt(denominator)
        if h["momentum"] > 0:
            s[1] = f32(h["momentum"]) * s[1] + step
            return w - s[1]
        return w - step

    def find(self, keys, part=0):
        keys = np.asarray(keys, np.int64)
        values = np.zeros((keys.shape[0], self.dim), np.float32)
        exists = np.zeros(keys.shape[0], bool)
        for i, k in enumerate(keys.tolist()):
            if k in self.rows:
                exists[i] = True
                values[i] = self.rows[k] if part == 0 else self.slots[k][part - 1]
        return values, exists

    def upsert(self, keys, values, part=0):
        values = np.asarray(values, np.float32)
        for i, k in enumerate(np.asarray(keys, np.int64).tolist()):
            if k not in self.rows:
                self._insert(k, np.zeros(self.dim, np.float32))
            if part == 0:
                self.rows[k] = self._round(values[i])
            else:
                self.slots[k][part - 1] = values[i]

    def remove(self, keys):
        for k in np.asarray(keys, np.int64).tolist():
            for d in (self.rows, self.slots, self.access):
                d.pop(k, None)

    def size(self):
        return len(self.rows)

    def export(self):
        """(keys, rows, slots) sorted by key."""
        keys = np.array(sorted(self.rows), np.int64)
        rows = np.array([self.rows[k] for k in keys.tolist()], np.float32).reshape(keys.size, self.dim)
        slots = np.array([self.slots[k] for k in keys.tolist()], np.float32).reshape(keys.size, self.num_slots,
                                                                                      self.dim)
        return keys, rows, slots

    def access_status(self):
        """(keys, counts, last, clock), sorted by key."""
        keys = np.array(sorted(self.rows), np.int64)
        counts = np.array([self.access[k][0] for k in keys.tolist()], np.int64)
        last = np.array([self.access[k][1] for k in keys.tolist()], np.int64)
        return keys, counts, last, self.clock


# ----------------------------------------------------------------------------------------------------------------
# gather_segment_sum (tf_fusedrec.ops.gather_segment_sum_ops): the recover gather and the combiner sums.
# ----------------------------------------------------------------------------------------------------------------

__all__ += ["gather_segment_sum", "gather_segment_sum_grad"]


def _feature_spans(index, segment_ids, num_segments):
    """[(feature's index part, its segment ids, its output rows)], checked as the op checks them."""
    index = np.asarray(index, np.int64).reshape(-1)
    spans, offset = [], 0
    for f, (seg, size) in enumerate(zip(segment_ids, num_segments)):
        seg, size = np.asarray(seg, np.int64).reshape(-1), int(size)
        if seg.size and (seg.min() < 0 or seg.max() >= size):
            raise ValueError(f"segment_ids[{f}] must be in [0, {size})")
        spans.append((index[offset:offset + seg.size], seg, size))
        offset += seg.size
    if offset != index.size:
        raise ValueError(f"index has {index.size} entries but segment_ids hold {offset} ids")
    return spans


def gather_segment_sum(params, index, segment_ids, num_segments):
    """Per feature f: out[f][segment_ids[f][j]] += params[index[o_f + j]], j in order, from zeros (a Python loop)."""
    params = np.asarray(params)
    if np.asarray(index).size and not 0 <= np.min(index) <= np.max(index) < params.shape[0]:
        raise ValueError(f"index must be in [0, {params.shape[0]})")
    outputs = []
    for part, seg, size in _feature_spans(index, segment_ids, num_segments):
        out = np.zeros((size, params.shape[1]), params.dtype)
        for i, s in zip(part.tolist(), seg.tolist()):
            out[s] = out[s] + params[i]
        outputs.append(out)
    return outputs


def gather_segment_sum_grad(grads, index, segment_ids, num_segments, num_params):
    """params_grad[index[o_f + j]] += grads[f][segment_ids[f][j]], f then j in order, from zeros."""
    dim = np.asarray(grads[0]).shape[1]
    out = np.zeros((int(num_params), dim), np.asarray(grads[0]).dtype)
    for g, (part, seg, _) in zip(grads, _feature_spans(index, segment_ids, num_segments)):
        g = np.asarray(g)
        for i, s in zip(part.tolist(), seg.tolist()):
            out[i] = out[i] + g[s]
    return out


def row_ids(row_splits, positions=None):
    """The row of each flat position: the number of row ends row_splits[1:] <= it (a position loop, no search)."""
    splits = np.asarray(row_splits)
    ends = splits[1:].tolist()
    if positions is None:
        positions = range(int(splits[-1]))
    rows = [sum(1 for e in ends if e <= int(p)) for p in np.asarray(positions).tolist()]
    return np.asarray(rows, splits.dtype).reshape(-1)


def fuse_ids(ids, categories):
    """ops.fuse_ids: (keys int64 [n], segments int32 [n], feature_sizes int32 [N]) of N id vectors."""
    ids = [np.asarray(x, np.int64).reshape(-1) for x in ids]
    sizes = np.array([x.size for x in ids], np.int32)
    keys = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    return keys.astype(np.int64), np.repeat(np.asarray(categories, np.int32), sizes), sizes


def valid_ids(ids):
    """ops.valid_ids: ([valid ids int64 [n_i]], [their flat positions int64 [n_i]]) of N id arrays (any shape)."""
    flat = [np.asarray(x, np.int64).reshape(-1) for x in ids]
    positions = [np.flatnonzero(x >= 0).astype(np.int64) for x in flat]
    return [x[p] for x, p in zip(flat, positions)], positions


def id_extremes(ids):
    """ops.id_extremes: (lows int64 [N], highs int64 [N]); an empty array gives int64's max as its low, min as high."""
    info = np.iinfo(np.int64)
    flat = [np.asarray(x, np.int64).reshape(-1) for x in ids]
    return (np.array([x.min() if x.size else info.max for x in flat], np.int64),
            np.array([x.max() if x.size else info.min for x in flat], np.int64))


def ragged_causal_attention(q, k, v, row_splits, bias=None, fixed_norm=0):
    """ops.ragged_causal_attention in float64, a loop over each sequence's (i, j <= i) pairs: out[i, h] = sum_j
    SiLU(<q_i, k_j>_h + bias[min(floor(log2(i - j + 1)), NB - 1), h]) / n_i * v[j, h], n_i = i + 1 (the position in
    its sequence) or fixed_norm when > 0."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    splits = np.asarray(row_splits, np.int64)
    nb = 0 if bias is None else np.asarray(bias).shape[0]
    out = np.zeros_like(q)
    for b in range(splits.size - 1):
        start, length = splits[b], splits[b + 1] - splits[b]
        for i in range(length):
            n = fixed_norm if fixed_norm > 0 else i + 1
            for j in range(i + 1):
                score = np.sum(q[start + i] * k[start + j], axis=-1)  # [H]
                if nb:
                    score = score + np.asarray(bias, np.float64)[min(int(np.floor(np.log2(i - j + 1))), nb - 1)]
                weight = score / (1.0 + np.exp(-score)) / n
                out[start + i] += weight[:, None] * v[start + j]
    return out


__all__ += ["ragged_causal_attention"]
