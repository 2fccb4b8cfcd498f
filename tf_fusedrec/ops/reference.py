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

__all__ = [
    "mix64",
    "owner_of",
    "segment_unique",
    "partition_by_owner",
    "category_unique",
    "decode_unified_keys",
    "packed_bits",
    "SegmentUniqueResult",
    "PartitionResult",
    "CategoryUniqueResult",
]

SegmentUniqueResult = collections.namedtuple(
    "SegmentUniqueResult", ["unique_keys", "unique_segment_ids", "inverse", "counts"])
PartitionResult = collections.namedtuple("PartitionResult", ["keys", "segment_ids", "splits", "order"])
CategoryUniqueResult = collections.namedtuple(
    "CategoryUniqueResult", ["unified_keys", "inverse", "unique_segment_ids", "segment_counts"])

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


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
GOLDEN = 0x9E3779B97F4A7C15


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


def packed_bits(num_segments):
    """b = max(1, ceil(log2(num_segments))), the number of high bits holding the segment in packed keys."""
    num_segments = int(num_segments)
    if num_segments < 1:
        raise ValueError(f"num_segments must be >= 1, got {num_segments}")
    return max(1, (num_segments - 1).bit_length())


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
