"""Benchmark of a table's training-step work: lookup + Adagrad update of each batch's unique keys, one thread.

    python -m tf_fusedrec.bench.table [--out DIR] [--dim 16] [--batches 50] [--repeats 3]

Workload (that of the measuring scripts this replaces): a dim-16 table pre-filled with keys 0..1M-1 (rows 0.01,
accumulators 0.1); batches of 16k keys drawn as 1.5M * r^3 (skewed; about an eighth fall beyond the pre-filled range,
so new keys keep arriving) and deduplicated; gradient 0.01, lr 0.05, new keys initialised to the same constants.
The first 5 batches warm up, then every batch is timed once, in order. Three ways, in one process with
TensorFlow's intra- and inter-op pools at one thread:

* native: the native table ops in a tf.function, native_table_lookup_or_init then native_table_apply_sparse (one
  probe per key each);
* tfra: TFRA's dynamic_embedding tables for rows and accumulators, two lookups and two upserts per key;
* floor: cc/bench/table_floor.cc, the same hash map as the native ops in a plain C++ loop (one fused pass, no
  TensorFlow), compiled here with g++ -O2 -march=native; it reads the very batches the other two run.

Each of --repeats runs builds fresh tables and times the same pass, the three variants taking turns so that a busy
machine slows all of them alike; keys_per_s is the median over the runs (all of them are kept under "runs").

It prints keys/s of each and, with --out DIR, writes DIR/table.json: {"native": {"keys_per_s": ...}, "tfra": {...},
"floor": {...}, "settings": {...}}.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import tf_fusedrec  # noqa: E402,F401  (selects Keras 2 before TensorFlow loads)
import tensorflow as tf  # noqa: E402

from tf_fusedrec import ops  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FLOOR_SOURCE = ROOT / "cc" / "bench" / "table_floor.cc"

ROW_INIT = 0.01
ACCUMULATOR_INIT = 0.1
GRAD = 0.01
LR = 0.05
PREFILL_CHUNK = 200_000


def progress(message):
    print(f"[table bench] {message}", file=sys.stderr, flush=True)


def make_batches(num_batches, batch_size, vocab, seed):
    """num_batches arrays of the unique keys of batch_size draws vocab * r^3 (r uniform in [0, 1))."""
    rng = np.random.default_rng(seed)
    return [np.unique((vocab * rng.random(batch_size) ** 3).astype(np.int64)) for _ in range(num_batches)]


def time_steps(step, batches, dim, warmup):
    """Runs step(keys, grads) on the first `warmup` batches, then times one pass over all of them: keys/s."""
    g = tf.fill([1, dim], GRAD)
    for b in batches[:warmup]:
        step(tf.constant(b), tf.broadcast_to(g, [len(b), dim]))
    n, start = 0, time.perf_counter()
    for b in batches:
        step(tf.constant(b), tf.broadcast_to(g, [len(b), dim]))
        n += len(b)
    seconds = time.perf_counter() - start
    return {"keys_per_s": n / seconds, "keys": n, "seconds": seconds}


def bench_native(batches, dim, prefill, warmup, run_index):
    table = ops.NativeTableResource(f"bench_native_{run_index}", dim, optimizer="adagrad", slot_init=[ACCUMULATOR_INIT],
                                    init="constant", value=ROW_INIT, hyperparameters={"epsilon": 0.0})
    for start in range(0, prefill, PREFILL_CHUNK):
        keys = tf.range(start, min(prefill, start + PREFILL_CHUNK), dtype=tf.int64)
        ops.native_table_upsert(table, keys, tf.fill([tf.size(keys), dim], ROW_INIT))
        ops.native_table_upsert(table, keys, tf.fill([tf.size(keys), dim], ACCUMULATOR_INIT), part="accumulator")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, dim], tf.float32)])
    def step(keys, grads):
        categories = tf.zeros_like(keys, tf.int32)
        ops.native_table_lookup_or_init(table, keys, categories, keys)
        ops.native_table_apply_sparse(table, keys, grads, categories, keys, lr=LR)

    result = time_steps(step, batches, dim, warmup)
    result["table_size"] = int(ops.native_table_size(table))
    return result


def bench_tfra(batches, dim, prefill, warmup, run_index):
    from tensorflow_recommenders_addons import dynamic_embedding as de  # noqa: PLC0415  (only this variant needs it)

    rows = de.get_variable(f"bench_tfra_rows_{run_index}", key_dtype=tf.int64, value_dtype=tf.float32, dim=dim,
                           initializer=tf.keras.initializers.Constant(ROW_INIT))
    acc = de.get_variable(f"bench_tfra_acc_{run_index}", key_dtype=tf.int64, value_dtype=tf.float32, dim=dim,
                          initializer=tf.keras.initializers.Constant(ACCUMULATOR_INIT))
    for start in range(0, prefill, PREFILL_CHUNK):
        keys = tf.range(start, min(prefill, start + PREFILL_CHUNK), dtype=tf.int64)
        rows.upsert(keys, tf.fill([tf.size(keys), dim], ROW_INIT))
        acc.upsert(keys, tf.fill([tf.size(keys), dim], ACCUMULATOR_INIT))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, dim], tf.float32)])
    def step(keys, grads):
        v = rows.lookup(keys)
        a = acc.lookup(keys) + grads * grads
        acc.upsert(keys, a)
        rows.upsert(keys, v - LR * grads / tf.sqrt(a))

    result = time_steps(step, batches, dim, warmup)
    result["table_size"] = int(rows.size())
    return result


class Floor:
    """cc/bench/table_floor.cc, compiled once into a temporary directory, run on the batches written beside it."""

    def __init__(self, batches, tmp):
        cxx = os.environ.get("CXX", "g++")
        if shutil.which(cxx) is None:
            raise RuntimeError(f"the floor needs a C++ compiler: {cxx} not found (set $CXX)")
        if not FLOOR_SOURCE.exists():
            raise RuntimeError(f"the floor needs a source checkout: {FLOOR_SOURCE} not found")
        self.binary = os.path.join(tmp, "table_floor")
        subprocess.run([cxx, "-O2", "-march=native", "-std=c++17", f"-I{ROOT}", str(FLOOR_SOURCE), "-o", self.binary],
                       check=True)
        self.batch_file = os.path.join(tmp, "batches.bin")
        with open(self.batch_file, "wb") as f:
            for b in batches:
                np.array([len(b)], np.int64).tofile(f)
                b.astype(np.int64).tofile(f)

    def __call__(self, batches, dim, prefill, warmup, run_index):  # noqa: ARG002  (the batches are in the file)
        out = subprocess.run([self.binary, "--dim", str(dim), "--prefill", str(prefill), "--warmup", str(warmup),
                              "--batches", self.batch_file], check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])


VARIANT_NAMES = ("floor", "native", "tfra")


def run(dim=16, num_batches=50, batch_size=16_000, prefill=1_000_000, vocab=1_500_000, warmup=5, seed=1,
        repeats=3):
    """Measures the three variants; returns {variant: {"keys_per_s": median, "runs": [...], ...}, "settings": {...}}."""
    batches = make_batches(num_batches, batch_size, vocab, seed)
    settings = {
        "dim": dim, "batches": num_batches, "batch_size": batch_size, "prefill": prefill, "vocab": vocab,
        "warmup": warmup, "seed": seed, "repeats": repeats,
        "unique_keys_per_batch": float(np.mean([len(b) for b in batches])), "threads": 1,
        "tensorflow": tf.__version__, "cpus": os.cpu_count(), "machine": platform.processor(),
    }
    progress(f"{num_batches} batches of {batch_size} keys ({settings['unique_keys_per_batch']:.0f} unique on "
             f"average), table of {prefill} keys, dim {dim}, {repeats} runs")
    runs = {name: [] for name in VARIANT_NAMES}
    with tempfile.TemporaryDirectory(prefix="table_floor_") as tmp:
        variants = {"floor": Floor(batches, tmp), "native": bench_native, "tfra": bench_tfra}
        for r in range(repeats):
            for name in VARIANT_NAMES:
                runs[name].append(variants[name](batches, dim, prefill, warmup, r))
                progress(f"run {r + 1}/{repeats} {name}: {runs[name][-1]['keys_per_s'] / 1e6:.2f} M keys/s")
    results = {}
    for name, measured in runs.items():
        median = sorted(measured, key=lambda m: m["keys_per_s"])[(len(measured) - 1) // 2]
        results[name] = dict(median, runs=[m["keys_per_s"] for m in measured])
    results["settings"] = settings
    return results


def print_table(results):
    tfra = results["tfra"]["keys_per_s"]
    print("| variant | M keys/s | vs tfra |")
    print("|---|---:|---:|")
    for name in VARIANT_NAMES:
        kps = results[name]["keys_per_s"]
        print(f"| {name} | {kps / 1e6:.2f} | {kps / tfra:.1f}x |")


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="directory for table.json")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batches", type=int, default=50, help="timed batches")
    parser.add_argument("--batch-size", type=int, default=16_000, help="keys drawn per batch (before dedup)")
    parser.add_argument("--prefill", type=int, default=1_000_000, help="keys in the table before the first batch")
    parser.add_argument("--vocab", type=int, default=1_500_000, help="keys are drawn below this")
    parser.add_argument("--warmup", type=int, default=5, help="batches run before timing")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="fresh runs of each variant (the median is reported)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    results = run(args.dim, args.batches, args.batch_size, args.prefill, args.vocab, args.warmup, args.seed,
                  args.repeats)
    print_table(results)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "table.json")
        with open(path, "w") as f:
            json.dump(results, f, indent=2)
        progress(f"wrote {path}")


if __name__ == "__main__":
    main()
