"""`python -m tf_fusedrec.train`: train a model from a configs/*.yaml, alone or under horovodrun.

    python -m tf_fusedrec.train --config configs/criteo_synthetic.yaml [--embedding fused|per_feature]
        [--steps N] [--model-dir DIR]
    horovodrun -np 2 -H localhost:2 --gloo python -m tf_fusedrec.train ...

Rank 0 shows a progress bar (step, loss, samples/s over all workers) and ends with a summary: samples/s, AUC on a
held-out stream, all-to-all calls and bytes per step. With --model-dir, every worker checkpoints its dense
weights, its shard of the embedding tables and the optimizer slots every `train.checkpoint_every` steps and at the
end, and a later run with the same --model-dir and worker count resumes where it stopped, on the same data
(batches are a function of (seed, rank, step)); rank 0 writes TensorBoard summaries under DIR/tensorboard.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

from tf_fusedrec import config as cfg
from tf_fusedrec.distributed import comm as comm_lib

EMBEDDINGS = ("fused", "per_feature", "fused_nodedup", "fused_source_hash")
DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "criteo_synthetic.yaml")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=DEFAULT_CONFIG, help="experiment YAML (default: configs/criteo_synthetic.yaml)")
    p.add_argument("--embedding", choices=EMBEDDINGS, default="fused")
    p.add_argument("--steps", type=int, help="override train.steps")
    p.add_argument("--batch-size", type=int, help="override train.batch_size (per worker)")
    p.add_argument("--model-dir", help="checkpoints and TensorBoard summaries; resumes from it when it has a checkpoint")
    p.add_argument("--no-progress", action="store_true", help="log lines instead of a progress bar")
    p.add_argument("--summary-json", help="rank 0 writes the final summary here")
    return p.parse_args(argv)


def init_workers():
    """(rank, size): Horovod when started by horovodrun, else one worker."""
    if any(k in os.environ for k in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")):
        hvd = comm_lib.import_horovod()
        hvd.init()
        return hvd.rank(), hvd.size()
    return 0, 1


def make_embedding(kind, features, config, name="sparse"):
    import tf_fusedrec as fr  # noqa: PLC0415

    common = {"optimizer": config.train.sparse_optimizer, "name": name}
    if kind == "per_feature":
        return fr.PerFeatureEmbedding(features, **common)
    modes = {"fused": {}, "fused_nodedup": {"dedup": "none"}, "fused_source_hash": {"fusion": "source_hash"}}
    if kind not in modes:
        raise ValueError(f"--embedding must be one of {EMBEDDINGS}, got {kind!r}")
    return fr.FusedEmbedding(features, **common, **modes[kind])


def make_model(config, embedding):
    from tf_fusedrec import models  # noqa: PLC0415

    m = config.model
    if m.name == "dlrm":
        return models.DLRM(embedding, bottom_mlp=m.bottom_mlp, top_mlp=m.top_mlp, num_dense=config.data.num_dense)
    return models.DCNv2(embedding, cross_layers=m.cross_layers, deep_mlp=m.deep_mlp, num_dense=config.data.num_dense)


def make_dataset(config, batch_size, rank, size, held_out=False, start_step=0, steps=None):
    """This worker's batches of the configured source."""
    from tf_fusedrec import data  # noqa: PLC0415

    d = config.data
    if d.source == "synthetic":
        inputs = [data.SparseInput(f.name, f.vocab, f.zipf, tuple(f.hotness) if isinstance(f.hotness, list)
                                   else f.hotness) for f in config.features]
        return data.synthetic_dataset(inputs, d.num_dense, batch_size, seed=d.seed, rank=rank, num_ranks=size,
                                      steps=steps, held_out=held_out, start_step=start_step)
    if d.source == "criteo":
        # Criteo files have no split: the first eval_batches batches of each worker are held out from training.
        ds = data.criteo_dataset(d.path, batch_size, rank=rank, num_ranks=size, num_dense=d.num_dense)
        if held_out:
            return ds.take(d.eval_batches)
        return ds.skip(d.eval_batches).repeat().skip(start_step)
    ds = data.movielens_dataset(d.path, batch_size, rank=rank, num_ranks=size,
                                split="test" if held_out else "train", seed=d.seed, shuffle=not held_out)
    return ds if held_out else ds.repeat().skip(start_step)


def check_features_match(config, sample):
    configured = {f.name for f in config.features}
    given = {k for k in sample if k != "dense"}
    missing = sorted(given - configured)
    if missing:
        raise ValueError(f"config: feature '{missing[0]}' of the {config.data.source} data is missing from features")
    extra = sorted(configured - given)
    if extra:
        raise ValueError(f"config: feature '{extra[0]}' is not in the {config.data.source} data (it has "
                         f"{sorted(given)})")


def auc(labels, scores):
    """Exact ROC AUC (Mann-Whitney U with tie correction)."""
    labels = np.asarray(labels) > 0.5
    pos, neg = labels.sum(), (~labels).sum()
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = np.asarray(scores)[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


class Progress:
    """A one-line progress bar on a terminal, a log line every `every` steps otherwise."""

    def __init__(self, total, every, enabled, bar):
        self.total, self.every, self.enabled = total, every, enabled
        self.bar = bar and sys.stderr.isatty()

    def update(self, step, loss, samples_per_s):
        if not self.enabled:
            return
        text = f"step {step}/{self.total}  loss {loss:.4f}  {samples_per_s:,.0f} samples/s"
        if self.bar:
            width = 30
            filled = int(width * step / max(self.total, 1))
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}   ")
            if step == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        elif step % self.every == 0 or step == self.total:
            print(text, file=sys.stderr, flush=True)


def make_train_step(model, optimizer, step_var=None):
    """The compiled step: binary cross-entropy on logits, mean over this worker's batch; counts steps in step_var."""
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)

    # No AutoGraph: the step has no tensor-dependent Python control flow, and converting Keras and TFRA code
    # costs more than the training run on small configs.
    @tf.function(autograph=False)
    def train_step(features, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        if step_var is not None:
            step_var.assign_add(1)
        return loss

    return train_step


def count_alltoall_ops(concrete_function):
    graph = concrete_function.graph
    ops = list(graph.get_operations())
    for f in graph._functions.values():  # noqa: SLF001  (nested functions, e.g. gradients)
        ops.extend(f.graph.get_operations() if hasattr(f, "graph") else [])
    return sum(1 for op in ops if op.type == "HorovodAlltoall")


def run(args):
    rank, size = init_workers()
    config = cfg.load_config(args.config)
    steps = args.steps if args.steps is not None else config.train.steps
    batch_size = args.batch_size if args.batch_size is not None else config.train.batch_size
    if steps <= 0 or batch_size <= 0:
        raise ValueError("--steps and --batch-size must be positive")
    import tf_fusedrec as fr  # noqa: PLC0415
    from tf_fusedrec.distributed.meter import AlltoallMeter  # noqa: PLC0415

    meter = AlltoallMeter().install() if size > 1 else None
    features = config.embedding_features()
    embedding = make_embedding(args.embedding, features, config)
    model = make_model(config, embedding)
    optimizer = fr.train.make_optimizer(model, default=config.train.dense_optimizer)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")

    manager = None
    start = 0
    if args.model_dir:
        rank_dir = os.path.join(args.model_dir, f"rank{rank}-of-{size}")
        others = [d for d in os.listdir(args.model_dir) if d.startswith("rank") and not d.endswith(f"-of-{size}")] \
            if os.path.isdir(args.model_dir) else []
        if others:
            raise ValueError(f"--model-dir {args.model_dir} holds checkpoints of another worker count ({others[0]}); "
                             f"resume with that many workers or use a new directory")
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
        manager = tf.train.CheckpointManager(checkpoint, rank_dir, max_to_keep=2)
    dataset = make_dataset(config, batch_size, rank, size)
    sample = next(iter(dataset.take(1)))[0]
    check_features_match(config, sample)
    model(sample, training=False)  # builds the dense weights before a restore
    if manager is not None and manager.latest_checkpoint:
        manager.checkpoint.restore(manager.latest_checkpoint).expect_partial()
        start = int(step_var.numpy())
        if rank == 0:
            print(f"resumed from {manager.latest_checkpoint} at step {start}", file=sys.stderr)
    if start >= steps:
        raise ValueError(f"--model-dir is already at step {start} >= --steps {steps}; ask for more steps")
    dataset = make_dataset(config, batch_size, rank, size, start_step=start)

    train_step = make_train_step(model, optimizer, step_var)

    writer = tf.summary.create_file_writer(os.path.join(args.model_dir, "tensorboard")) \
        if args.model_dir and rank == 0 else None
    progress = Progress(steps, config.train.log_every, rank == 0, not args.no_progress)
    iterator = iter(dataset)
    warmup = min(3, steps - start - 1)
    timed_steps, timed_seconds, loss_value = 0, 0.0, float("nan")
    for step in range(start + 1, steps + 1):
        features_batch, labels = next(iterator)
        if step == start + 1 + warmup and meter is not None:
            meter.reset()
        t0 = time.perf_counter()
        loss_value = float(train_step(features_batch, labels))
        elapsed = time.perf_counter() - t0
        if step > start + warmup:
            timed_steps += 1
            timed_seconds += elapsed
        progress.update(step, loss_value, batch_size * size / max(elapsed, 1e-9))
        if writer is not None and (step % config.train.log_every == 0 or step == steps):
            with writer.as_default(step=step):
                tf.summary.scalar("loss", loss_value)
                if hasattr(embedding, "statistics"):
                    for name, stats in embedding.statistics().items():
                        for stat, value in stats.items():
                            tf.summary.scalar(f"features/{name}/{stat}", value)
        if manager is not None and (step % config.train.checkpoint_every == 0 or step == steps):
            manager.save(checkpoint_number=step)

    result = {
        "config": config.name,
        "embedding": args.embedding,
        "workers": size,
        "batch_size_per_worker": batch_size,
        "steps": steps,
        "final_loss": loss_value,
        "samples_per_s": batch_size * size * timed_steps / timed_seconds if timed_seconds else float("nan"),
        "alltoall_ops_in_step_graph": count_alltoall_ops(train_step.get_concrete_function(features_batch, labels)),
    }
    if meter is not None:
        result.update(meter.per_step(timed_steps))
    result["auc"] = evaluate(model, config, batch_size, rank, size)
    if rank == 0:
        if writer is not None:
            with writer.as_default(step=steps):
                tf.summary.scalar("auc", result["auc"])
            writer.flush()
        print("summary: " + json.dumps(result), flush=True)
        if args.summary_json:
            with open(args.summary_json, "w") as f:
                json.dump(result, f, indent=2)
    return result


def evaluate(model, config, batch_size, rank, size):
    """AUC over every worker's share of the held-out stream (config.data.eval_batches batches per worker)."""
    scores, labels = [], []
    held_out = make_dataset(config, batch_size, rank, size, held_out=True).take(config.data.eval_batches)
    predict = tf.function(lambda f: tf.sigmoid(model(f, training=False)), autograph=False)
    for features_batch, y in held_out:
        scores.append(predict(features_batch).numpy())
        labels.append(y.numpy())
    scores = np.concatenate(scores) if scores else np.zeros(0)
    labels = np.concatenate(labels) if labels else np.zeros(0)
    if size > 1:
        hvd = comm_lib.import_horovod()
        scores = hvd.allgather(tf.constant(scores, tf.float32), name="FusedRec/eval_scores").numpy()
        labels = hvd.allgather(tf.constant(labels, tf.float32), name="FusedRec/eval_labels").numpy()
    return auc(labels, scores)


def main(argv=None):
    try:
        run(parse_args(argv))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
