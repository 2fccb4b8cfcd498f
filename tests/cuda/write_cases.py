"""Writes the CUDA harness's cases: inputs and the NumPy oracle's expected outputs, as raw binary files.

    PYTHONPATH=. python tests/cuda/write_cases.py OUT_DIR [--bench]     (from the repository root)

Format (read by tests/cuda/harness.cu; documented in tests/cuda/README.md):

* ``OUT_DIR/cases.txt``: one case per line, ``name key=value ...`` with ``dtype`` (int32 | int64), ``num_segments``,
  ``num_ranks``, ``bench`` (0 | 1) and one expectation per checked op: ``segment_unique``, ``category_packed``,
  ``category_hashed``, each ``ok``, ``bad_segment:<position>`` or ``bad_key:<position>`` (the first position the
  kernel must report instead of writing outputs).
* ``OUT_DIR/<name>/<array>.bin``: a headerless little-endian array; its length is the file size over the item size.
  Keys arrays (``keys``, ``segment_unique.unique_keys``, ``partition.keys``) have the case's dtype, unified keys are
  int64, every other array is int32. Arrays of ops whose expectation is not ``ok`` are not written.

No pickle and no NumPy headers, so the C++ side needs nothing but fread.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from tf_fusedrec.bench.ops import make_group  # the benchmark's fused Zipf group
from tf_fusedrec.ops import reference

INT64_MAX = np.iinfo(np.int64).max


def zipf_group(num_categories, keys_per_category, seed):
    """The fused group python -m tf_fusedrec.bench.ops times: Zipf(1.1) ids of a 10^6-id vocabulary per category."""
    return make_group(num_categories, keys_per_category, zipf=1.1, vocab=1_000_000, seed=seed)


def correctness_cases():
    """(name, keys, segment_ids, num_segments, num_ranks): every shape the issue lists, both key dtypes."""
    rng = np.random.default_rng(13)
    cases = []
    for dtype in (np.int32, np.int64):
        tag = np.dtype(dtype).name
        n = 5000
        cases.append((f"random_{tag}", rng.integers(0, 300, n).astype(dtype), rng.integers(0, 7, n), 7, 8))
        zk, zs = zipf_group(26, 1024, seed=1)
        if dtype == np.int32:
            zk = zk % (2**31 - 1)
        cases.append((f"zipf_{tag}", zk.astype(dtype), zs, 26, 8))
        cases.append((f"empty_{tag}", np.zeros(0, dtype), np.zeros(0, np.int32), 3, 4))
        cases.append((f"one_{tag}", np.array([42], dtype), np.array([2], np.int32), 3, 4))
        cases.append((f"all_equal_{tag}", np.full(3000, 7, dtype), np.zeros(3000, np.int32), 1, 1))
        cases.append((f"same_key_every_segment_{tag}", np.full(600, 7, dtype), np.arange(600) % 6, 6, 3))
        info = np.iinfo(dtype)
        extremes = np.array([info.max, info.min, -1, 0, 1, info.max, info.min, -1], dtype)
        cases.append((f"extremes_{tag}", np.tile(extremes, 40), np.repeat(np.arange(2), 160), 2, 5))
        # Many segments: a warp's lanes span several segments, and segment ids reach 2^16.
        many = 70_000
        cases.append((f"many_segments_{tag}", rng.integers(0, 5, many).astype(dtype), rng.permutation(many) % 65_537,
                       65_537, 64))
        # A size that leaves the last tile and the last warp partly empty, and the same pair in far-apart tiles.
        odd = 256 * 7 + 33
        keys = rng.integers(0, 50, odd).astype(dtype)
        cases.append((f"ragged_tail_{tag}", keys, (keys % 3).astype(np.int32), 3, 7))
        cases.append((f"negative_segment_{tag}", np.arange(100, dtype=dtype),
                      np.where(np.arange(100) == 61, -2, 0), 1, 2))
        cases.append((f"segment_too_large_{tag}", np.arange(100, dtype=dtype),
                      np.where(np.arange(100) >= 80, 5, 1), 4, 2))
    cases.append(("int64_max", np.array([INT64_MAX, 3, INT64_MAX, 2**62, INT64_MAX], np.int64),
                  np.array([0, 0, 0, 1, 1], np.int32), 2, 3))
    return cases


def bench_cases():
    """The issue's benchmark sizes: 26 categories x 4096 and x 65536 Zipf(1.1) ids (the groups of bench.ops)."""
    return [
        (f"bench_zipf_26x{per}", *zipf_group(26, per, seed=0), 26, 8) for per in (4096, 65536)
    ]


def _first_bad_segment(segments, num_segments):
    bad = np.flatnonzero((segments < 0) | (segments >= num_segments))
    return int(bad[0]) if bad.size else None


def _write(directory, name, array, dtype):
    array = np.ascontiguousarray(np.asarray(array).astype(np.dtype(dtype).newbyteorder("<")))
    with open(os.path.join(directory, name + ".bin"), "wb") as f:
        f.write(array.tobytes())


def write_case(out_dir, name, keys, segments, num_segments, num_ranks, bench):
    """Writes one case's inputs and expected outputs; returns its cases.txt line."""
    keys = np.asarray(keys)
    segments = np.asarray(segments).astype(np.int32)
    kdt = keys.dtype
    directory = os.path.join(out_dir, name)
    os.makedirs(directory, exist_ok=True)
    _write(directory, "keys", keys, kdt)
    _write(directory, "segment_ids", segments, np.int32)

    expect = {}
    # segment_unique rejects negative segment ids only; category_unique also those >= num_segments.
    bad = _first_bad_segment(segments, np.iinfo(np.int64).max)
    if bad is None:
        su = reference.segment_unique(keys, segments)
        for field in su._fields:
            _write(directory, f"segment_unique.{field}", getattr(su, field),
                   kdt if field == "unique_keys" else np.int32)
        expect["segment_unique"] = "ok"
    else:
        expect["segment_unique"] = f"bad_segment:{bad}"

    _write(directory, "owner_of", reference.owner_of(keys, num_ranks), np.int32)
    part = reference.partition_by_owner(keys, num_ranks, segments)
    _write(directory, "partition.keys", part.keys, kdt)
    _write(directory, "partition.segment_ids", part.segment_ids, np.int32)
    _write(directory, "partition.splits", part.splits, np.int32)
    _write(directory, "partition.order", part.order, np.int32)

    bad = _first_bad_segment(segments, num_segments)
    for encoding in ("packed", "hashed"):
        op = f"category_{encoding}"
        if bad is not None:
            expect[op] = f"bad_segment:{bad}"
            continue
        key_limit = 1 << (63 - reference.packed_bits(num_segments))
        k64 = keys.astype(np.int64)
        bad_keys = np.flatnonzero((k64 < 0) | (k64 >= key_limit))
        if encoding == "packed" and bad_keys.size:
            expect[op] = f"bad_key:{int(bad_keys[0])}"
            try:  # the oracle must agree that these keys cannot be packed
                reference.category_unique(keys, segments, num_segments, encoding)
            except ValueError:
                pass
            else:
                raise AssertionError(f"{name}: the oracle packed keys the writer expected to be rejected")
            continue
        cu = reference.category_unique(keys, segments, num_segments, encoding)
        _write(directory, f"{op}.unified_keys", cu.unified_keys, np.int64)
        _write(directory, f"{op}.inverse", cu.inverse, np.int32)
        _write(directory, f"{op}.unique_segment_ids", cu.unique_segment_ids, np.int32)
        _write(directory, f"{op}.segment_counts", cu.segment_counts, np.int32)
        expect[op] = "ok"

    fields = [name, f"dtype={np.dtype(kdt).name}", f"num_segments={num_segments}", f"num_ranks={num_ranks}",
              f"bench={int(bench)}"] + [f"{op}={value}" for op, value in expect.items()]
    return " ".join(fields)


def write_cases(out_dir, bench=False):
    """Writes every correctness case (and the benchmark cases when bench) and cases.txt; returns the case names."""
    os.makedirs(out_dir, exist_ok=True)
    cases = [(c, False) for c in correctness_cases()]
    if bench:
        cases += [(c, True) for c in bench_cases()]
    lines = [write_case(out_dir, *case, bench=is_bench) for case, is_bench in cases]
    with open(os.path.join(out_dir, "cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return [line.split()[0] for line in lines]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--bench", action="store_true", help="also write the 26 x 4096 and 26 x 65536 Zipf groups")
    args = parser.parse_args(argv)
    names = write_cases(args.out_dir, bench=args.bench)
    print(f"wrote {len(names)} cases to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
