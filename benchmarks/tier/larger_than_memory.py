"""A table larger than this machine's memory trains, checkpoints and restores (issue 57's second target).

One worker, one tiered native table (FusedEmbedding(tier=fr.Tiered(--dram-gib, DIR/store))): four features of one
spec (dim --dim, Adam: a row and two slot rows per key), a linear model, fr.train.make_optimizer, a tf.function step.

    python benchmarks/tier/larger_than_memory.py train --dir DIR --table-gib 32 --dram-gib 4 --out RESULT.json
    python benchmarks/tier/larger_than_memory.py restore --dir DIR --dram-gib 4 --out RESULT.json

train: steps of --batch ids per feature, --new of them ids never seen (the table grows by that many keys a step) and
the rest Zipf(1.05)-skewed re-reads of the ids seen so far, until the table's rows and slots reach --table-gib; then
--steady-steps steps of re-reads only (the speed of a table this size); then a full checkpoint in DIR/model (the table
read chunk by chunk into part files: tf_fusedrec/train/checkpoint.py). Keeps a sample of rows and slots (DRAM and
disk) in DIR/sample.npz, and removes the store at the end (disk space for the restore).
restore: a fresh process restores the checkpoint onto an empty tiered table, checks the sample bit for bit, and trains
--steady-steps steps. Each phase prints progress lines and writes its figures (seconds, samples/s, hit rates, peak
and current resident memory, disk bytes) into --out (train's figures are kept; restore adds its own).
"""

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_fusedrec as fr  # noqa: E402
from tf_fusedrec.distributed.comm import SingleProcessComm  # noqa: E402
from tf_fusedrec.ops import native_table_ops as nt  # noqa: E402
from tf_fusedrec.train.checkpoint import Checkpointer  # noqa: E402

FEATURES = ("f0", "f1", "f2", "f3")
GIB = 1 << 30


def memory():
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}


def directory_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:  # a file RocksDB removed meanwhile
                pass
    return total


class Model(tf.keras.Model):
    def __init__(self, embedding):
        super().__init__()
        self.embedding = embedding
        self.dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=3))

    def call(self, inputs, training=None):
        out = self.embedding({f: inputs[f] for f in FEATURES}, training=training)
        return self.dense(tf.concat([out[f] for f in FEATURES], axis=1))[:, 0]


def build(args):
    optimizer = {"name": "adam", "learning_rate": 0.001}
    features = [fr.Feature(f, dim=args.dim, optimizer=optimizer) for f in FEATURES]  # one group: one table
    tier = fr.Tiered(int(args.dram_gib * GIB), os.path.join(args.dir, "store"))
    model = Model(fr.FusedEmbedding(features, name="big", comm=SingleProcessComm(), tier=tier))
    opt = fr.train.make_optimizer(model, default={"name": "adam", "learning_rate": 0.001})
    step = tf.Variable(0, dtype=tf.int64, trainable=False)

    @tf.function(autograph=False)
    def train_step(inputs):
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(inputs["label"], logits))
        variables = model.trainable_variables
        update = opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        with tf.control_dependencies([update]):
            step.assign_add(1)
            return tf.identity(loss)

    model.dense.build([None, args.dim * len(FEATURES)])
    opt.create_slots(model.trainable_variables)
    # --delta-steps: every checkpoint after the first is a delta (full_every far away)
    full_every = 1 << 40 if getattr(args, "delta_steps", 0) else 0
    checkpointer = Checkpointer(os.path.join(args.dir, "model"), model, opt, step, SingleProcessComm(), keep=1,
                                full_every=full_every)
    return model, train_step, step, checkpointer


def batch(rng, seen, new, size):
    """Per feature `size` ids: `new` never seen (ids seen to seen + new: a new key in each feature's category), the
    rest Zipf(1.05) re-reads of ids < seen."""
    out = {}
    fresh = np.arange(seen, seen + new, dtype=np.int64)
    for f in FEATURES:
        old = (rng.zipf(1.05, size - new) - 1) % seen if seen else np.zeros(size - new, np.int64)
        out[f] = tf.constant(np.concatenate([fresh, old.astype(np.int64)]))
    out["label"] = tf.constant((rng.random(size) < 0.25).astype(np.float32))
    return out


class Window:
    """Samples/s, hit rate and disk traffic between two progress lines."""

    def __init__(self, table):
        self.table = table
        self.reset()

    def reset(self):
        self.began, self.stats, self.samples = time.perf_counter(), self.table.tier_stats(), 0

    def line(self):
        now, stats = time.perf_counter(), self.table.tier_stats()
        d = {k: stats[k] - self.stats[k] for k in ("hits", "disk_hits", "new_keys", "bytes_read", "bytes_written")}
        reads = d["hits"] + d["disk_hits"]
        seconds = now - self.began
        return {"samples_per_s": self.samples / seconds, "seconds": seconds,
                "hit_rate": d["hits"] / reads if reads else None, "disk_hit_keys": d["disk_hits"],
                "new_keys": d["new_keys"], "read_mb_per_s": d["bytes_read"] / seconds / 1e6,
                "written_mb_per_s": d["bytes_written"] / seconds / 1e6}


def steady(args, train_step, table, seen, rng, what):
    """--steady-steps steps of re-reads only; -> the window's figures."""
    window = Window(table)
    for _ in range(args.steady_steps):
        train_step(batch(rng, seen, 0, args.batch))
        window.samples += args.batch
    figures = window.line()
    print(f"[{what}] {args.steady_steps} steps of re-reads: {figures['samples_per_s']:,.0f} samples/s, hit rate "
          f"{figures['hit_rate']:.3f}, read {figures['read_mb_per_s']:.0f} MB/s, written "
          f"{figures['written_mb_per_s']:.0f} MB/s", flush=True)
    return figures


def train(args):
    model, train_step, _, checkpointer = build(args)
    table = model.embedding.tables[0]
    row_bytes = 4 * args.dim * 3  # row + Adam's m and v
    target = int(args.table_gib * GIB / row_bytes)
    rng = np.random.default_rng(5)
    print(f"[train] filling to {target:,} keys ({target * row_bytes / GIB:.1f} GiB of rows and slots) with "
          f"{args.dram_gib} GiB of DRAM; {args.new:,} new ids per feature a step", flush=True)
    began, seen, steps, window, log = time.perf_counter(), 0, 0, Window(table), []
    ids = -(-target // len(FEATURES))  # every feature's ids 0 .. ids - 1: a key each
    while seen < ids:
        new = min(args.new, ids - seen)
        train_step(batch(rng, seen, new, args.batch))
        seen, steps = seen + new, steps + 1
        window.samples += args.batch
        if steps % args.every == 0 or seen >= ids:
            figures = window.line()
            stats, mem = table.tier_stats(), memory()
            entry = {"step": steps, "keys": stats["dram_rows"] + stats["disk_rows"], "rss": mem["VmRSS"],
                     "store_bytes": directory_bytes(os.path.join(args.dir, "store")), **figures,
                     "elapsed": time.perf_counter() - began}  # figures' "seconds": the window's
            log.append(entry)
            print(f"[train] step {steps}: {entry['keys'] / 1e6:.1f}M keys ({entry['keys'] * row_bytes / GIB:.1f} GiB), "
                  f"{figures['samples_per_s']:,.0f} samples/s, hit rate {figures['hit_rate'] or 0:.3f}, RSS "
                  f"{mem['VmRSS'] / GIB:.2f} GiB, store {entry['store_bytes'] / GIB:.1f} GiB, "
                  f"{entry['elapsed'] / 60:.1f} min", flush=True)
            window.reset()
    fill_seconds = time.perf_counter() - began
    steady_figures = steady(args, train_step, table, seen, rng, "train")
    store_bytes = directory_bytes(os.path.join(args.dir, "store"))
    t0 = time.perf_counter()
    final = checkpointer.save()
    save_seconds = time.perf_counter() - t0
    ckpt_bytes = directory_bytes(final)
    print(f"[train] checkpoint {final}: {ckpt_bytes / GIB:.1f} GiB in {save_seconds:.0f} s", flush=True)
    delta = None
    if args.delta_steps:  # then a delta checkpoint after --delta-steps more steps of re-reads
        changed_before = table.tier_stats()
        for _ in range(args.delta_steps):
            train_step(batch(rng, seen, 0, args.batch))
        t0 = time.perf_counter()
        delta_dir = checkpointer.save()
        delta_seconds = time.perf_counter() - t0
        manifest = json.loads(Path(delta_dir, "manifest.json").read_text())
        delta = {"steps": args.delta_steps, "seconds": delta_seconds, "bytes": directory_bytes(delta_dir),
                 "kind": manifest["kind"], "files": len(os.listdir(delta_dir)),
                 "disk_hits_between": table.tier_stats()["disk_hits"] - changed_before["disk_hits"],
                 "rss_after": memory()["VmRSS"]}
        print(f"[train] delta checkpoint after {args.delta_steps} steps: {delta['bytes'] / GIB:.2f} GiB in "
              f"{delta_seconds:.0f} s ({manifest['kind']})", flush=True)
    # A sample to check the restore against: DRAM entries and entries held only on disk.
    sample = [nt.native_table_export_chunk(table.resource, cursor, args.sample) for cursor in (nt.EXPORT_START, (1, 0))]
    np.savez(os.path.join(args.dir, "sample.npz"), **{f"{what}{i}": getattr(c, what).numpy()
                                                      for i, c in enumerate(sample) for what in ("keys", "rows", "slots")})
    stats, mem = table.tier_stats(), memory()
    result = {"command": " ".join(sys.argv), "dim": args.dim, "optimizer": "adam", "batch_per_feature": args.batch,
              "features": len(FEATURES), "new_ids_per_feature_step": args.new, "dram_bytes": int(args.dram_gib * GIB),
              "keys": stats["dram_rows"] + stats["disk_rows"], "dram_rows": stats["dram_rows"],
              "disk_rows": stats["disk_rows"], "rows_and_slots_bytes": (stats["dram_rows"] + stats["disk_rows"]) * row_bytes,
              "machine_memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
              "fill": {"steps": steps, "seconds": fill_seconds, "log": log}, "steady": steady_figures,
              "store_bytes": store_bytes,
              "checkpoint": {"seconds": save_seconds, "bytes": ckpt_bytes, "files": len(os.listdir(final))},
              "delta_checkpoint": delta,
              "peak_rss": mem["VmHWM"], "rss": mem["VmRSS"], "tier_stats": stats}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"train": result}, indent=1))
    print(f"[train] peak RSS {mem['VmHWM'] / GIB:.2f} GiB for {result['rows_and_slots_bytes'] / GIB:.1f} GiB of rows "
          f"and slots; wrote {args.out}", flush=True)
    shutil.rmtree(os.path.join(args.dir, "store"), ignore_errors=True)  # room for the restore's store


def restore(args):
    shutil.rmtree(os.path.join(args.dir, "store"), ignore_errors=True)
    model, train_step, step, checkpointer = build(args)
    table = model.embedding.tables[0]
    t0 = time.perf_counter()
    info = checkpointer.restore()
    seconds = time.perf_counter() - t0
    mem = memory()
    print(f"[restore] step {info['step']}: {info['bytes_read'] / GIB:.1f} GiB read in {seconds:.0f} s, peak RSS "
          f"{mem['VmHWM'] / GIB:.2f} GiB", flush=True)
    checked = 0
    with np.load(os.path.join(args.dir, "sample.npz")) as z:
        for i in range(2):
            keys = z[f"keys{i}"]
            values, exists = nt.native_table_find(table.resource, keys, part=0)
            assert exists.numpy().all(), "a sampled key is missing after the restore"
            np.testing.assert_array_equal(values.numpy(), z[f"rows{i}"])
            for s in range(z[f"slots{i}"].shape[1]):
                values, _ = nt.native_table_find(table.resource, keys, part=s + 1)
                np.testing.assert_array_equal(values.numpy(), z[f"slots{i}"][:, s])
            checked += len(keys)
    print(f"[restore] {checked:,} sampled keys' rows and slots equal the saved table's bit for bit", flush=True)
    stats = table.tier_stats()
    seen = (stats["dram_rows"] + stats["disk_rows"]) // len(FEATURES)
    steady_figures = steady(args, train_step, table, seen, np.random.default_rng(9), "restore")
    mem = memory()
    out = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    out["restore"] = {"command": " ".join(sys.argv), "seconds": seconds, "bytes_read": info["bytes_read"],
                      "ids_per_feature": seen, "sampled_keys_equal": checked, "steady": steady_figures,
                      "peak_rss": mem["VmHWM"], "rss": mem["VmRSS"], "tier_stats": stats}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"[restore] peak RSS {mem['VmHWM'] / GIB:.2f} GiB; wrote {args.out}", flush=True)
    shutil.rmtree(os.path.join(args.dir, "store"), ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("phase", choices=["train", "restore"])
    p.add_argument("--dir", required=True, help="holds the store, the checkpoint and the sample")
    p.add_argument("--table-gib", type=float, default=32, help="rows and slots to fill the table with")
    p.add_argument("--dram-gib", type=float, default=4, help="the table's DRAM budget (fr.Tiered dram_bytes)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=16384, help="ids per feature and step")
    p.add_argument("--new", type=int, default=12288, help="of which never seen before (while filling)")
    p.add_argument("--steady-steps", type=int, default=50)
    p.add_argument("--every", type=int, default=50, help="steps between progress lines")
    p.add_argument("--sample", type=int, default=10000, help="keys of DRAM and of disk checked after the restore")
    p.add_argument("--delta-steps", type=int, default=0,
                   help="train: after the full checkpoint, this many steps of re-reads, then a delta checkpoint")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    train(args) if args.phase == "train" else restore(args)


if __name__ == "__main__":
    main()
