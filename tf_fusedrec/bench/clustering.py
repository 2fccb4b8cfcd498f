"""`python -m tf_fusedrec.bench.clustering`: what key-centric sample clustering saves in the fwp schedule.

    python -m tf_fusedrec.bench.clustering [--config configs/criteo_synthetic.yaml] [--micro-batches 2,4,8]
        [--batches 8]

For each batch of the config's data (one worker's, at the config's batch size) and each k: the unique (feature, id)
pairs a worker sends per batch, summed over its k micro-batches, for the naive contiguous split and for the clustered
order (tf_fusedrec.train.clustering), against the whole batch's unique pairs (what sync and dbp send). Prints a
table (means over batches) and writes OUT/clustering.json.
"""

import argparse
import json
import os
import time

import numpy as np

from tf_fusedrec import config as cfg
from tf_fusedrec.train import clustering, experiment


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.bench.clustering", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=experiment.DEFAULT_CONFIG)
    p.add_argument("--micro-batches", default="2,4,8")
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--out", default="bench_results")
    return p.parse_args(argv)


def column(value):
    """A feature's ids as NumPy: [B] or [B, L] with -1 padding (ragged rows padded)."""
    if hasattr(value, "to_tensor"):
        value = value.to_tensor(default_value=-1)
    return value.numpy()


def main(argv=None):
    args = parse_args(argv)
    config = cfg.load_config(args.config)
    batch_size = args.batch_size or config.train.batch_size
    names = [f.name for f in config.features]
    counts = [int(k) for k in args.micro_batches.split(",") if k]
    rows = {k: {"naive": [], "clustered": [], "whole": [], "cluster_ms": []} for k in counts}
    for features, _ in experiment.make_dataset(config, batch_size, 0, 1).take(args.batches):
        samples, codes = clustering.sample_pairs([column(features[n]) for n in names], names)
        whole = clustering.unique_pairs_per_batch(batch_size, samples, codes, 1)
        for k in counts:
            t0 = time.perf_counter()
            order = clustering.cluster_order_numpy(batch_size, samples, codes, k)
            rows[k]["cluster_ms"].append((time.perf_counter() - t0) * 1e3)
            rows[k]["naive"].append(clustering.unique_pairs_per_batch(batch_size, samples, codes, k))
            rows[k]["clustered"].append(clustering.unique_pairs_per_batch(batch_size, samples, codes, k, order))
            rows[k]["whole"].append(whole)
    report = {"config": config.name, "batch_size": batch_size, "batches": args.batches,
              "micro_batches": {str(k): {m: float(np.mean(v)) for m, v in r.items()} for k, r in rows.items()}}
    lines = ["| k | whole batch | naive split | naive / whole | clustered | clustered / whole | clustering ms/batch |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for k, r in report["micro_batches"].items():
        lines.append(f"| {k} | {r['whole']:,.0f} | {r['naive']:,.0f} | {r['naive'] / r['whole']:.2f}x | "
                     f"{r['clustered']:,.0f} | {r['clustered'] / r['whole']:.2f}x | {r['cluster_ms']:.1f} |")
    print("\n".join(lines))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "clustering.json"), "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
