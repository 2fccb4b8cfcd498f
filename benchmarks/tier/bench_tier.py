"""One worker of the tiered-table benchmark (issue 57): criteo_synthetic's model and shapes (26 features in two
Adagrad groups, dims 16 and 8, DLRM, batch 2048 per worker) with every feature's vocabulary raised to --vocab ids at
Zipf --zipf, trained with every row in DRAM (--mode dram) or with tiered tables (--mode tiered: --dram-bytes per table
and worker in DRAM, the rest in RocksDB under --tier-path). Run under horovodrun by bench_tier.sh.

Before timing, each worker's tables are filled with every id of every feature it owns (what a long run converges
to: the table of the whole vocabulary, its Zipf tail on disk) by training lookups of initial rows; then --warmup
untimed steps, then --steps timed steps on fresh batches (pre-generated, none repeated). Rank 0 writes OUT/result.json:
samples/s over both workers, the prefill's seconds, each worker's table rows and bytes (rows and slots), DRAM budget,
and over the timed steps the tiers' hit rate and disk bytes read and written per step, and each worker's peak
resident memory (VmHWM) and resident memory at the end (VmRSS).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_fusedrec as fr  # noqa: E402
from tf_fusedrec import config as cfg  # noqa: E402
from tf_fusedrec.distributed import comm as comm_lib  # noqa: E402
from tf_fusedrec.ops import native_table_ops  # noqa: E402
from tf_fusedrec.train import experiment  # noqa: E402


def memory():
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}


def config_for(vocab, zipf, batch_size):
    import yaml  # noqa: PLC0415

    with open(experiment.DEFAULT_CONFIG) as f:
        raw = yaml.safe_load(f)
    bits = int(np.ceil(np.log2(vocab)))
    raw["feature_defaults"].update({"vocab": vocab, "zipf": zipf, "max_id_bits": bits})
    raw["train"]["batch_size"] = batch_size
    return cfg.parse_config(raw, "bench_tier")


def prefill(embedding, comm, vocab, chunk):
    """Inserts every id of every feature into the table of its owner (initial rows, by training lookups)."""
    for group, table in zip(embedding.groups, embedding.tables):
        chunk = min(chunk, table.upsert_chunk() or chunk)  # a tiered table takes at most half its cache per call
        for segment, _ in enumerate(group.feature_names):
            for start in range(0, vocab, chunk):
                ids = tf.range(start, min(start + chunk, vocab), dtype=tf.int64)
                # This worker's share, as the layer routes (category, id) pairs: partition_by_owner, then the owner's
                # category unique makes the table keys.
                part = fr.ops.partition_by_owner(ids, comm.size, segment_ids=tf.fill(tf.shape(ids), segment))
                begin = int(tf.reduce_sum(part.splits[:comm.rank]))
                mine = slice(begin, begin + int(part.splits[comm.rank]))
                owned, segments = part.keys[mine], part.segment_ids[mine]
                unique = fr.ops.category_unique(owned, segments, group.num_categories, group.encoding)
                native_table_ops.native_table_lookup_or_init(table.resource, unique.unified_keys,
                                                             unique.unique_segment_ids, owned)


def tier_totals(embedding):
    totals = {}
    for stats in embedding.tier_statistics().values():
        for k, v in stats.items():
            if k != "hit_rate":
                totals[k] = totals.get(k, 0) + v
    return totals


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["dram", "tiered"], required=True)
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--vocab", type=int, default=1_500_000)
    p.add_argument("--dram-bytes", default="192MiB")
    p.add_argument("--tier-path", default="/tmp/fusedrec_bench_tier")
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    comm = comm_lib.init_workers()
    config = config_for(args.vocab, args.zipf, args.batch_size)
    tier = None
    if args.mode == "tiered":
        from tf_fusedrec.distributed.tier import Tiered, parse_bytes  # noqa: PLC0415

        tier = Tiered(parse_bytes(args.dram_bytes, "--dram-bytes"), args.tier_path)
    embedding = experiment.make_embedding("fused", config.embedding_features(), config, comm=comm, tier=tier)
    model = experiment.make_model(config, embedding)
    batches = experiment.make_dataset(config, args.batch_size, comm.rank, comm.size).take(
        args.warmup + args.steps).cache()
    for _ in batches:  # generated before timing
        pass
    model(next(iter(batches.take(1)))[0], training=False)
    optimizer = fr.train.make_optimizer(model, default=config.train.dense_optimizer)
    pipeline = fr.train.TrainPipeline(model, optimizer, experiment.binary_cross_entropy(), batches, schedule="sync")

    began = time.perf_counter()
    prefill(embedding, comm, args.vocab, chunk=200_000)
    comm.allgather(tf.zeros([1, 1]), name="bench_tier/prefilled")
    prefill_s = time.perf_counter() - began
    if comm.rank == 0:
        print(f"[bench_tier] {args.mode}: tables filled in {prefill_s:.0f} s, training", file=sys.stderr, flush=True)
    rows = [int(t.size()) for t in embedding.tables]
    for _ in range(args.warmup):
        pipeline.progress()
    before = tier_totals(embedding)
    comm.allgather(tf.zeros([1, 1]), name="bench_tier/start")
    began = time.perf_counter()
    for _ in range(args.steps):
        loss = pipeline.progress()
    float(loss)
    comm.allgather(tf.zeros([1, 1]), name="bench_tier/end")
    seconds = time.perf_counter() - began
    after = tier_totals(embedding)
    delta = {k: after[k] - before[k] for k in after}
    found = delta["hits"] + delta["disk_hits"]
    step_ms = 1e3 * seconds / args.steps
    table_bytes = experiment.table_bytes(embedding, optimizer, comm)
    mine = {"rows": rows, "prefill_s": prefill_s, "memory": memory(),
            "hit_rate": delta["hits"] / found if found else 1.0, "disk_hits_per_step": delta["disk_hits"] / args.steps,
            "new_keys_per_step": delta["new_keys"] / args.steps,
            "disk_bytes_read_per_step": delta["bytes_read"] / args.steps,
            "disk_bytes_written_per_step": delta["bytes_written"] / args.steps,
            "evict_ms_per_step": delta["evict_micros"] / 1e3 / args.steps,
            "read_ms_per_step": delta["read_micros"] / 1e3 / args.steps, "step_ms": step_ms,
            "dram_rows": after["dram_rows"], "disk_rows": after["disk_rows"], "dram_bytes": after["dram_bytes"]}
    everyone = comm.allgather(tf.constant([[ord(c) for c in json.dumps(mine).ljust(2048)]], tf.int32),
                              name="bench_tier/result").numpy()
    if comm.rank == 0:
        workers = [json.loads("".join(map(chr, row)).strip()) for row in everyone]
        result = {"mode": args.mode, "zipf": args.zipf, "vocab": args.vocab, "features": len(config.features),
                  "dram_bytes_per_table": None if tier is None else tier.dram_bytes, "batch_size": args.batch_size,
                  "workers": comm.size, "steps": args.steps, "warmup": args.warmup,
                  "samples_per_s": args.batch_size * comm.size * args.steps / seconds,
                  "table_bytes_per_worker": table_bytes, "per_worker": workers,
                  "command": " ".join(sys.argv)}
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump(result, f, indent=1)
        print(f"[bench_tier] {args.mode} zipf {args.zipf}: {result['samples_per_s']:,.0f} samples/s, hit rate "
              f"{[round(w['hit_rate'], 3) for w in workers]}, prefill {workers[0]['prefill_s']:.0f} s", flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
