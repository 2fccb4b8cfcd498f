"""How much of a fused_hot step could move off the step into the input pipeline (HypeReca §4.2, "batched indexing"):
times the sender-side indexing of one worker's batch (fuse, segment unique, hot/cold classification, partition of
the cold pairs by owner: everything before the keys all-to-all that needs no collective) alone, in a tf.function.

    .venv/bin/python benchmarks/profiling/profile_hot_indexing.py [--config configs/criteo_synthetic.yaml] [--workers 2]
        [--hot-rows 2000] [--repeats 50]

The hot set is the --hot-rows most frequent pairs of each group on 20 batches; the batch is worker 0's of --workers.
Compare the printed milliseconds with the step time of `fused_hot` in the training benchmark: that is the most moving
the indexing into tf.data could save, and only where the worker would otherwise wait (on 2 cores shared by 2
workers, tf.data's threads take the same cores).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import numpy as np  # noqa: E402

import tf_fusedrec  # noqa: E402,F401  (before TensorFlow: sets the Keras flavour)
import tensorflow as tf  # noqa: E402

from tf_fusedrec import config as cfg  # noqa: E402
from tf_fusedrec import ops  # noqa: E402
from tf_fusedrec.distributed import group_lookup as gl  # noqa: E402
from tf_fusedrec.train import experiment  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/criteo_synthetic.yaml")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--hot-rows", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args()
    config = cfg.load_config(args.config)
    layer = experiment.make_embedding("fused", config.embedding_features(), config, name="profile")
    batches = [f for f, _ in experiment.make_dataset(config, config.train.batch_size, 0, args.workers).take(20)]

    def group_ids(batch, group):
        return [tf.reshape(batch[n].flat_values if isinstance(batch[n], tf.RaggedTensor) else batch[n], [-1])
                for n in group.feature_names]

    hot = []
    for group in layer.groups:
        counts = {}
        for batch in batches:
            keys, segments, _ = gl.fuse(group_ids(batch, group), group.num_categories)
            unified = gl.unified_keys(keys, segments, group.num_categories, group.encoding).numpy()
            values, n = np.unique(unified, return_counts=True)
            for v, c in zip(values, n):
                counts[v] = counts.get(v, 0) + c
        top = sorted(counts, key=counts.get, reverse=True)[:args.hot_rows]
        hot.append(tf.constant(np.sort(np.array(top, np.int64))))

    @tf.function
    def index(batch):
        out = []
        for group, hot_keys in zip(layer.groups, hot):
            keys, segments, _ = gl.fuse(group_ids(batch, group), group.num_categories)
            keys, segments, inverse = gl.segment_dedup(keys, segments)
            position, is_hot = gl.classify_hot(keys, segments, hot_keys, group.num_categories, group.encoding)
            cold = tf.logical_not(is_hot)
            part = ops.partition_by_owner(tf.boolean_mask(keys, cold), args.workers,
                                          segment_ids=tf.boolean_mask(segments, cold))
            out += [part.keys, part.splits, inverse, position]
        return out

    index(batches[0])
    times = []
    for i in range(args.repeats):
        start = time.perf_counter()
        index(batches[i % len(batches)])
        times.append(time.perf_counter() - start)
    ms = np.array(times) * 1e3
    print(f"sender indexing of one worker's batch ({config.train.batch_size} samples, {len(layer.groups)} groups, "
          f"R={args.hot_rows} per group, {args.workers} owners): median {np.median(ms):.2f} ms, "
          f"p10 {np.percentile(ms, 10):.2f} ms, p90 {np.percentile(ms, 90):.2f} ms over {args.repeats} calls")


if __name__ == "__main__":
    main()
