"""Reading throughput of the file readers (issue 56's target): each reader's records/s on one core, parsed into the
batch dict the layer takes, beside the built-in sources.

    nice -n 10 .venv/bin/python benchmarks/data/read_bench.py --out benchmarks/results/data/read_bench.json

Two data sets, written once under --work (reused when there):

* ``criteo_synthetic``'s shapes with int64 ids: C1..C23 one id, C24..C26 a list of 0 to 4 ids (configs/
  criteo_synthetic.yaml's hotness), ids drawn from its Zipf(1.225) over 100,000; 13 float dense columns; the label.
  As Parquet, TFRecord and CSV (ids of a list joined by "|"), read by data.readers.FileBatches; beside it the
  built-in synthetic source (data.synthetic_dataset), which makes the same shapes.
* Criteo's own layout: a Kaggle-like TSV (13 integer columns, 26 hex-string columns, some values missing), read by
  the built-in reader (data.criteo_dataset), and its conversion (data.convert: string ids hashed, lists of 0 or 1)
  as Parquet, TFRecord and CSV read by FileBatches.

Every reader runs as worker 0 of 2 with 2048 records per worker and batch (the 2-worker benchmark's batch): a worker
reads the whole stream and keeps its half, so "records/s" (the whole stream's) is what must keep up with the
samples/s 2-worker training consumes over both workers. One core: the process
is pinned to --core and TensorFlow to one intra- and one inter-op thread. Each reader is timed over one whole pass
(from its first batch on, so nothing read ahead escapes the clock), --repeats times, alternating the readers. The
figure compared with the target is records per CPU second of the process (the median pass): on a shared machine,
wall time counts other people's work too, CPU time does not. The best wall pass is shown beside it. The whole-stream records/s is compared with twice the
samples/s of 2-worker fused training in benchmarks/results/bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

BATCH = 2048
WORKERS = 2
TARGET_FROM = "benchmarks/results/bench.json"  # 2-worker fused training's samples/s on criteo_synthetic


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=100_000, help="records per data set (default 100000)")
    p.add_argument("--work", default="/tmp/fusedrec_read_bench", help="where the data sets are written")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--core", type=int, default=0, help="the CPU the process is pinned to")
    p.add_argument("--only", default=None, help="comma-separated reader names to run (default: all)")
    p.add_argument("--out", default=None, help="write the results as JSON here (and a .md table beside it)")
    return p.parse_args(argv)


def _zipf_ids(rng, n, vocab=100_000, s=1.225):

    weights = 1.0 / np.arange(1, vocab + 1) ** s
    cdf = np.cumsum(weights / weights.sum())
    return np.minimum(np.searchsorted(cdf, rng.random(n)), vocab - 1).astype(np.int64)


def synthetic_table(n, seed=0):
    """criteo_synthetic's shapes as a pyarrow Table (int64 ids)."""
    import pyarrow as pa  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    columns = {"label": (rng.random(n) < 0.25).astype(np.float32)}
    for i in range(1, 14):
        columns[f"I{i}"] = rng.random(n).astype(np.float32)
    for i in range(1, 24):
        columns[f"C{i}"] = _zipf_ids(rng, n)
    for i in range(24, 27):
        lengths = rng.integers(0, 5, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        columns[f"C{i}"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(_zipf_ids(rng, int(lengths.sum()))))
    return pa.table(columns)


def synthetic_schema(fmt):
    features = {f"C{i}": {"type": "int64"} for i in range(1, 24)}
    for i in range(24, 27):
        features[f"C{i}"] = {"type": "int64", "shape": "list", **({"separator": "|"} if fmt == "csv" else {})}
    return {"label": "label", "dense": [f"I{i}" for i in range(1, 14)], "features": features}


def criteo_tsv(path, n, seed=0):

    rng = np.random.default_rng(seed)
    ints = rng.integers(0, 1000, (n, 13))
    missing = rng.random((n, 13)) < 0.1
    cats = _zipf_ids(rng, n * 26).reshape(n, 26)
    cat_missing = rng.random((n, 26)) < 0.1
    labels = (rng.random(n) < 0.25).astype(int)
    with open(path, "w") as f:
        for r in range(n):
            dense = ["" if missing[r, j] else str(ints[r, j]) for j in range(13)]
            sparse = ["" if cat_missing[r, j] else f"{cats[r, j] * 2654435761 % 2 ** 32:08x}" for j in range(26)]
            f.write("\t".join([str(labels[r])] + dense + sparse) + "\n")


def _write(table, schema, directory, fmt):
    from tf_fusedrec.data import convert  # noqa: PLC0415

    return convert.write(table, schema, directory, fmt, files=2)


def prepare(work, n):
    """Writes the data sets under `work` (once) -> {reader name: a function making its dataset}."""
    from tf_fusedrec import data  # noqa: PLC0415
    from tf_fusedrec.config import load_config  # noqa: PLC0415
    from tf_fusedrec.data import convert  # noqa: PLC0415
    from tf_fusedrec.data.files import parse_schema  # noqa: PLC0415
    from tf_fusedrec.data.readers import FileBatches  # noqa: PLC0415

    root = os.path.join(work, str(n))
    done = os.path.join(root, "done")
    synthetic_names = [f"C{i}" for i in range(1, 27)]
    if not os.path.exists(done):
        os.makedirs(root, exist_ok=True)
        table = synthetic_table(n)
        for fmt in ("parquet", "tfrecord", "csv"):
            _write(table, synthetic_schema(fmt), os.path.join(root, f"synthetic_{fmt}"), fmt)
        tsv = os.path.join(root, "criteo.tsv")
        criteo_tsv(tsv, n)
        converted = convert.criteo_table(tsv)
        for fmt in ("parquet", "tfrecord", "csv"):
            convert.write(converted, convert.criteo_schema(), os.path.join(root, f"criteo_{fmt}"), fmt, files=2)
        open(done, "w").close()

    def file_reader(kind, fmt):
        raw = synthetic_schema(fmt) if kind == "synthetic" else convert.criteo_schema()
        schema = parse_schema(raw, fmt, synthetic_names)
        return lambda: FileBatches(fmt, os.path.join(root, f"{kind}_{fmt}", "part-*"), schema, BATCH, rank=0,
                                   num_ranks=WORKERS, epochs=1).dataset()

    config = load_config(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "criteo_synthetic.yaml"))
    inputs = [data.SparseInput(f.name, f.vocab, f.zipf, tuple(f.hotness) if isinstance(f.hotness, list)
                               else f.hotness) for f in config.features]
    steps = n // (BATCH * WORKERS)
    readers = {
        "synthetic (built-in)": lambda: data.synthetic_dataset(inputs, 13, BATCH, seed=0, rank=0, num_ranks=WORKERS,
                                                               steps=steps),
        "criteo TSV (built-in)": lambda: data.criteo_dataset(os.path.join(root, "criteo.tsv"), BATCH, rank=0,
                                                             num_ranks=WORKERS),
    }
    for kind in ("synthetic", "criteo"):
        for fmt in ("parquet", "tfrecord", "csv"):
            readers[f"{kind} as {fmt}"] = file_reader(kind, fmt)
    return readers


def time_pass(make):
    """(whole-stream records per wall second, per CPU second of the process, batches) of one whole pass, from the
    dataset made (its map function traced, the files checked) to its end: nothing made ahead escapes the clock."""
    ds = make()
    batches, samples = 0, 0
    t0, c0 = time.perf_counter(), time.process_time()
    for _, label in ds:
        batches += 1
        samples += int(label.shape[0])
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return samples * WORKERS / seconds, samples * WORKERS / cpu, batches


def main(argv=None):
    args = parse_args(argv)
    os.sched_setaffinity(0, {args.core})
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: PLC0415

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import tf_fusedrec  # noqa: F401,PLC0415

    readers = prepare(args.work, args.records)
    if args.only:
        readers = {k: v for k, v in readers.items() if k in args.only.split(",")}
    runs = {name: [] for name in readers}
    for repeat in range(args.repeats):
        for name, make in readers.items():
            runs[name].append(time_pass(make))
            print(f"repeat {repeat + 1}/{args.repeats} {name}: {runs[name][-1][0]:,.0f} records/s, "
                  f"{runs[name][-1][1]:,.0f} per CPU second", file=sys.stderr, flush=True)
    target = None
    try:
        with open(TARGET_FROM) as f:
            target = 2 * json.load(f)["modes"]["fused"]["samples_per_s"]
    except (OSError, KeyError, ValueError):
        pass
    results = {name: {"records_per_cpu_s": float(np.median([r[1] for r in rs])),
                      "records_per_s": max(r[0] for r in rs),
                      "records_per_cpu_s_repeats": [r[1] for r in rs], "records_per_s_repeats": [r[0] for r in rs],
                      "timed_batches": rs[0][2]}
               for name, rs in runs.items()}
    out = {"records": args.records, "batch_size_per_worker": BATCH, "workers": WORKERS, "one_core": True,
           "target_records_per_s": target, "target_from": f"2 x fused samples_per_s of {TARGET_FROM}",
           "readers": results, "command": " ".join(["benchmarks/data/read_bench.py"] + (argv or sys.argv[1:]))}
    lines = ["| reader | records per CPU second (median) | x target | records/s, best wall pass |", "|---|---|---|---|"]
    for name, r in results.items():
        ratio = f"{r['records_per_cpu_s'] / target:.2f}" if target else "-"
        lines.append(f"| {name} | {r['records_per_cpu_s']:,.0f} | {ratio} | {r['records_per_s']:,.0f} |")
    text = "\n".join(lines)
    print(text)
    if target:
        print(f"\ntarget: {target:,.0f} records/s (twice the samples/s of 2-worker fused training, {TARGET_FROM})")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
