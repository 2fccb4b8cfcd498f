"""Benchmark of the dedup ops against what TensorFlow offers today.

    python -m tf_fusedrec.bench.ops [--categories 26] [--keys-per-category 4096] [--zipf 1.1] [--threads N]

For M categories of Zipf-distributed ids it times, each inside one tf.function and after warm-up:

* ``segment_unique`` on the fused group (FusedRec step a.2);
* ``M x tf.unique``: one unique per category, what per-feature lookup does today;
* ``tf.unique packed``: one tf.unique over ``(segment << 56) | key`` (the one-call strawman);
* ``tf.unique all``: one tf.unique over all keys ignoring segments (the floor: same size, less information);
* ``category_unique`` (packed and hashed) on the same fused group, as the owner sees it with one worker;
* an empty tf.function, the fixed cost of one call that every row includes.

``--threads N`` sets TensorFlow's intra- and inter-op pools to N threads (default: TensorFlow's choice, one per
core). The M separate calls are independent ops that TensorFlow runs concurrently on the inter-op pool.

It prints the median time per call, keys/s and the ratio of each to the M separate calls and to the floor.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import tf_fusedrec  # noqa: E402,F401  (selects Keras 2 before TensorFlow loads)
import tensorflow as tf  # noqa: E402

from tf_fusedrec import ops  # noqa: E402


def make_group(num_categories, keys_per_category, zipf, vocab, seed):
    """Fused keys and segment ids: per category Zipf ids below `vocab`, shuffled into a per-category id space."""
    rng = np.random.default_rng(seed)
    keys, segments = [], []
    for c in range(num_categories):
        ranks = np.minimum(rng.zipf(zipf, keys_per_category), vocab) - 1
        permutation_salt = rng.integers(1, 2**40)
        keys.append((ranks * 2654435761 + permutation_salt) % (2**40))  # hot ids are not the small ones
        segments.append(np.full(keys_per_category, c, np.int32))
    return np.concatenate(keys).astype(np.int64), np.concatenate(segments)


def build_variants(keys, segments, num_categories):
    n = keys.shape[0]
    per_category = n // num_categories
    keys_t = tf.constant(keys)
    segments_t = tf.constant(segments)

    @tf.function
    def fused_segment_unique():
        return ops.segment_unique(keys_t, segments_t).inverse

    @tf.function
    def separate_unique():
        return [tf.unique(keys_t[c * per_category : (c + 1) * per_category]).idx for c in range(num_categories)]

    @tf.function
    def packed_unique():
        packed = tf.bitwise.bitwise_or(tf.bitwise.left_shift(tf.cast(segments_t, tf.int64), 56), keys_t)
        return tf.unique(packed).idx

    @tf.function
    def all_unique():
        return tf.unique(keys_t).idx

    @tf.function
    def category_unique_packed():
        return ops.category_unique(keys_t, segments_t, num_categories, "packed").inverse

    @tf.function
    def category_unique_hashed():
        return ops.category_unique(keys_t, segments_t, num_categories, "hashed").inverse

    @tf.function
    def empty():
        return tf.constant(0)

    return {
        "segment_unique": fused_segment_unique,
        "category_unique packed": category_unique_packed,
        "category_unique hashed": category_unique_hashed,
        f"{num_categories} x tf.unique": separate_unique,
        "tf.unique packed": packed_unique,
        "tf.unique all (floor)": all_unique,
        "empty tf.function (call overhead)": empty,
    }


def time_variants(variants, repeats, calls):
    """Median seconds per call of each variant; variants alternate within each repeat so drift hits all alike."""
    for fn in variants.values():
        for _ in range(5):
            fn()
    samples = {name: [] for name in variants}
    for r in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls)
        print(f"  repeat {r + 1}/{repeats} done", file=sys.stderr, flush=True)
    return {name: float(np.median(s)) for name, s in samples.items()}


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--categories", type=int, default=26)
    parser.add_argument("--keys-per-category", type=int, default=4096)
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the ids (> 1)")
    parser.add_argument("--vocab", type=int, default=1_000_000, help="ids per category")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100, help="calls per timed block")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="intra- and inter-op threads (0: TensorFlow's default)")
    parser.add_argument("--json", help="also write the results to this file")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    keys, segments = make_group(args.categories, args.keys_per_category, args.zipf, args.vocab, args.seed)
    n = keys.shape[0]
    unique_pairs = int(ops.segment_unique(keys, segments).unique_keys.shape[0])
    print(
        f"{args.categories} categories x {args.keys_per_category} keys = {n} keys, Zipf {args.zipf}, "
        f"{unique_pairs} unique (category, id) pairs; TensorFlow {tf.__version__}, "
        f"{os.cpu_count()} CPUs, {args.threads or 'default'} TF threads; "
        f"median of {args.repeats} x {args.calls} calls inside tf.function",
        flush=True,
    )
    times = time_variants(build_variants(keys, segments, args.categories), args.repeats, args.calls)
    separate = times[f"{args.categories} x tf.unique"]
    floor = times["tf.unique all (floor)"]
    print(f"\n| variant | ms / call | M keys/s | vs {args.categories} x tf.unique | vs tf.unique all |")
    print("|---|---:|---:|---:|---:|")
    for name, t in times.items():
        print(f"| {name} | {t * 1e3:.3f} | {n / t / 1e6:.1f} | {separate / t:.2f}x | {floor / t:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "keys": n, "unique_pairs": unique_pairs, "seconds_per_call": times}, f,
                      indent=2)


if __name__ == "__main__":
    main()
