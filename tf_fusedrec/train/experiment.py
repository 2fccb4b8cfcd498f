"""Building an experiment from a configs/*.yaml: its embedding layer, model, datasets, and evaluation.

Library code shared by the train CLI (train/app.py) and the benchmark (bench/train_bench.py).
"""

import os

import numpy as np
import tensorflow as tf

EMBEDDINGS = ("fused", "per_feature", "fused_nodedup", "fused_source_hash")
DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "criteo_synthetic.yaml")


def make_embedding(kind, features, config, comm=None, name="sparse", replication=None, storage="float32",
                   eviction=None, table_backend=None, admission=None, expiry=None, rounding=None, tier=None):
    """The embedding layer of a kind in EMBEDDINGS, over `comm` (None: the process's default); `replication`,
    `storage`, `eviction`, `table_backend` (None: the config's embedding.table_backend), `admission`, `expiry` and
    `rounding` (None: the config's embedding.table_rounding): FusedEmbedding's hot-row replication, row storage,
    eviction, tables, table policies and float16 rounding (fused kinds only; per_feature is the TFRA baseline);
    `tier`: None or an fr.Tiered (tables larger than memory)."""
    import tf_fusedrec as fr  # noqa: PLC0415

    common = {"optimizer": config.train.sparse_optimizer, "name": name, "comm": comm}
    if kind == "per_feature":
        return fr.PerFeatureEmbedding(features, **common)
    modes = {"fused": {}, "fused_nodedup": {"dedup": "none"}, "fused_source_hash": {"fusion": "source_hash"}}
    if kind not in modes:
        raise ValueError(f"--embedding must be one of {EMBEDDINGS}, got {kind!r}")
    if replication is not None:
        common["replication"] = replication
    backend = config.embedding.table_backend if table_backend is None else table_backend
    rounding = config.embedding.table_rounding if rounding is None else rounding
    return fr.FusedEmbedding(features, **common, **modes[kind], storage=storage, eviction=eviction,
                             table_backend=backend, admission=admission, expiry=expiry, rounding=rounding, tier=tier)


def _tables(embedding):
    """The layer's ShardedTables and ReplicatedTables (their .params: the rows, as a TFRA variable or HalfRows)."""
    return embedding.sharded_tables() + embedding.replicated_tables()


def table_rows(embedding):
    """Rows this worker's embedding layer holds (sharded and replicated tables), an int."""
    return sum(int(t.params.size()) for t in _tables(embedding))


def evicted_rows(embedding):
    """Rows this worker's embedding layer has evicted so far."""
    return sum(s["evicted"] for s in embedding.eviction_statistics().values())


def table_bytes(embedding, optimizer, comm):
    """{"rows": [bytes per worker], "slots": [...]}: each worker's embedding keys and rows (sharded and replicated;
    8 bytes a key, 4 a float32 value, 2 a float16 one) and its optimizer slot rows (float32), over every worker (one
    allgather)."""
    from tf_fusedrec.distributed.table import row_bytes  # noqa: PLC0415

    rows = slots = 0
    for table in _tables(embedding):
        rows += row_bytes(table.params)
        if table.trainable is not None:
            slots += sum(row_bytes(slot) for _, slot in optimizer.slot_tables(table.trainable))
    everyone = comm.allgather(tf.constant([[rows, slots]], tf.int64), name="FusedRec/summary/table_bytes").numpy()
    return {"rows": everyone[:, 0].tolist(), "slots": everyone[:, 1].tolist()}


def make_model(config, embedding):
    from tf_fusedrec import models  # noqa: PLC0415

    m = config.model
    if m.name == "grm":
        return models.GRM(embedding, sequence_feature=config.data.sequences.feature, num_blocks=m.num_blocks,
                          hidden_dim=m.hidden_dim, num_heads=m.num_heads, position_buckets=m.position_buckets,
                          attention_norm=m.attention_norm, pooling=m.pooling, experts=m.experts,
                          expert_units=m.expert_units, tower_units=m.tower_units)
    if m.name == "dlrm":
        tasks = 2 if config.data.sequential else 1  # click and conversion
        return models.DLRM(embedding, bottom_mlp=m.bottom_mlp, top_mlp=m.top_mlp, num_dense=config.data.num_dense,
                           tasks=tasks)
    return models.DCNv2(embedding, cross_layers=m.cross_layers, deep_mlp=m.deep_mlp, num_dense=config.data.num_dense)


def make_dataset(config, batch_size, rank, size, held_out=False, start_step=0, steps=None):
    """This worker's (features, labels) batches of the configured source (a file source's sample weights,
    data.schema.weight, left out: the train app reads them through file_batches)."""
    from tf_fusedrec import data  # noqa: PLC0415

    d = config.data
    if d.sequential and d.source != "grm_synthetic":  # movielens_seq, files of sequences: fixed counts of samples
        ds = sequence_dataset(config, batch_size, rank, size, held_out=held_out).skip(start_step)
        return ds if steps is None else ds.take(max(steps - start_step, 0))
    if d.source in ("tfrecord", "parquet", "csv"):  # config.FILE_SOURCES; the train app resumes by file_batches
        ds = file_batches(config, batch_size, rank, size, held_out=held_out).dataset()
        if d.schema.weight is not None:
            ds = ds.map(lambda features, label, _weight: (features, label))
        return ds if held_out else ds.skip(start_step)
    if d.source == "grm_synthetic":  # labels float32 [B, 2] (click, conversion)
        return data.grm_dataset(config, batch_size, seed=d.seed, rank=rank, num_ranks=size, held_out=held_out,
                                start_step=start_step, steps=steps)
    if d.source == "synthetic":
        inputs = [data.SparseInput(f.name, f.vocab, f.zipf, tuple(f.hotness) if isinstance(f.hotness, list)
                                   else f.hotness) for f in config.features]
        return data.synthetic_dataset(inputs, d.num_dense, batch_size, seed=d.seed, rank=rank, num_ranks=size,
                                      steps=steps, held_out=held_out, start_step=start_step, drift=d.drift)
    if d.source == "criteo":
        # Criteo files have no split: the first eval_batches batches of each worker are held out from training.
        ds = data.criteo_dataset(d.path, batch_size, rank=rank, num_ranks=size, num_dense=d.num_dense)
        if held_out:
            return ds.take(d.eval_batches)
        return ds.skip(d.eval_batches).repeat().skip(start_step)
    ds = data.movielens_dataset(d.path, batch_size, rank=rank, num_ranks=size,
                                split="test" if held_out else "train", seed=d.seed,
                                shuffle=d.shuffle and not held_out)
    return ds if held_out else ds.repeat().skip(start_step)


def file_batches(config, batch_size, rank, size, held_out=False, position=None, comm=None, on_wait=None, reads=None):
    """This worker's data.readers.FileBatches of a file source (config.FILE_SOURCES). Held out: one pass over
    data.eval_path or, without it, over the first eval_batches x batch_size x size records of data.path, which
    training then skips (in every pass). Training: endless, from `position` (a FilePosition, what
    position_of_file_checkpoint returns) or the start. With data.follow, training follows data.path as files arrive,
    the workers agreeing on them through `comm` (None: each on its own, as for a sample of the first batches);
    `on_wait`: see FileBatches. The held-out records are then those of the files complete when it is made. `reads`:
    the records a worker reads at once, when they are not its batches (FileBatches.samples; None: batch_size)."""
    from tf_fusedrec.data.readers import FileBatches  # noqa: PLC0415

    d = config.data
    common = {"schema": d.schema, "batch_size": reads or batch_size, "rank": rank, "num_ranks": size,
              "on_bad_record": d.on_bad_record, "max_bad_records": d.max_bad_records}
    holdout = 0 if d.eval_path else d.eval_batches * batch_size * size
    follow = None
    if d.follow:
        from tf_fusedrec.data.follow import FollowSettings, Listing  # noqa: PLC0415

        follow = FollowSettings(d.poll_seconds, d.idle_timeout_seconds, d.follow_marker)
    if held_out:
        paths = d.eval_path or d.path
        if follow is not None and not d.eval_path:
            paths = [path for _, path in Listing(d.path, follow.marker).complete()] or d.path
        return FileBatches(d.source, paths, epochs=1, limit=None if d.eval_path else holdout, **common)
    if follow is not None:
        return FileBatches(d.source, d.path, position=position, skip_records=holdout, follow=follow, comm=comm,
                           on_wait=on_wait, **common)
    return FileBatches(d.source, d.path, position=position, skip_records=holdout, **common)


def position_of_file_checkpoint(restored):
    """The data.files.FilePosition in a file source's checkpoint (every worker saved the same one): where the
    stream continues, on any worker count and batch size.

    Raises:
      ValueError: the checkpoint holds no stream position (written by another source, or before they were saved).
    """
    from tf_fusedrec.data.files import FilePosition  # noqa: PLC0415

    positions = restored.get("stream_positions")
    if not positions or len(positions[0]) not in (4, len(FilePosition._fields)):  # 4: written before data.follow
        raise ValueError(f"checkpoint {restored['directory']} holds no file-stream position (not written by a run of "
                         f"a file source): a tfrecord/parquet/csv config cannot continue from it; start a new "
                         f"--model-dir")
    return FilePosition(*positions[0])


BALANCE_MODES = ("tokens", "none")
FILE_SAMPLE_READS = 256  # the records a worker reads at once from files of sequences (FileBatches.samples)


def sequence_samples(config, rank, size, held_out=False, start=0, batch_size=None):
    """This worker's sample dicts of a sequence config (config.data.sequential; each dict: the sequence feature int64
    [L], the other features int64 [], "labels" float32 [2], "tokens" L): what SequenceBatches cuts into batches.
    Training (held_out False) is endless; the held-out stream is endless for grm_synthetic, one shuffled pass over
    the test split for movielens_seq, and for a file source one pass over data.eval_path or, without it, over the
    first data.eval_batches x batch_size x size records (which training skips). `start`: the stream from its
    start-th sample on (the skipped samples are not made)."""
    return sequence_stream(config, rank, size, held_out=held_out, start=start, batch_size=batch_size)[0]


def sequence_stream(config, rank, size, held_out=False, start=0, batch_size=None):
    """sequence_samples, and a file source's FileBatches reading them (its count of skipped bad records; None for
    the other sources)."""
    from tf_fusedrec import data  # noqa: PLC0415

    d = config.data
    if d.sequential and d.source in ("tfrecord", "parquet", "csv"):  # config.FILE_SOURCES
        if batch_size is None and not d.eval_path:
            raise ValueError("sequence_samples: a file source without data.eval_path needs the batch_size (its first "
                             "data.eval_batches x batch_size x workers records are held out)")
        reader = file_batches(config, batch_size, rank, size, held_out=held_out, reads=FILE_SAMPLE_READS)
        return reader.samples(start), reader
    if d.source == "grm_synthetic":
        return data.grm_samples(config, seed=d.seed, rank=rank, num_ranks=size, held_out=held_out, start=start), None
    if d.source == "movielens_seq":
        from tf_fusedrec.data import movielens_seq  # noqa: PLC0415

        return movielens_seq.movielens_seq_samples(
            d.path, movielens_seq.MovieLensSeqSpec.from_config(config), rank=rank, num_ranks=size,
            held_out=held_out, shuffle=True, seed=d.seed, epochs=1 if held_out else None, start=start), None
    from tf_fusedrec.config import SEQUENCE_SOURCES  # noqa: PLC0415

    raise ValueError(f"data.source {d.source!r} is not a sequence source {SEQUENCE_SOURCES} (nor a file source with "
                     f"data.sequences)")


def sequence_signature(config):
    """The batch signature of a sequence config: the sequence feature ragged int64 [B, None], every other feature
    int64 [B], "labels" float32 [B, 2]."""
    name = config.data.sequences.feature
    return {name: tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64),
            **{f.name: tf.TensorSpec([None], tf.int64) for f in config.features if f.name != name},
            "labels": tf.TensorSpec([None, 2], tf.float32)}


def sequence_dataset(config, batch_size, rank, size, held_out=False):
    """This worker's (features, labels) batches of batch_size consecutive samples of sequence_samples (the last
    batch of a finite stream holds the rest)."""
    from tf_fusedrec.train import batching  # noqa: PLC0415

    def batches():
        return batching.fixed_batches(sequence_samples(config, rank, size, held_out=held_out,
                                                       batch_size=batch_size), batch_size)

    return batching.to_dataset(batches, sequence_signature(config), label_key="labels")


class SequenceBatches:
    """This worker's batches of a sequence config (config.data.sequential) for the train app: token-balanced
    (MTGRBoost's dynamic sequence batching: each batch's token count is the closest cut to batch_size x the mean
    sequence length, so workers get different sample counts and similar token counts) or of a fixed sample count.
    Records each batch's (samples, tokens) in `counts`, in the order the batches are made (tf.data prefetches, so it
    may run a few batches ahead of training), and the StreamPosition after each, so that `position_after(n)`, the
    position after the first n batches training consumed, can be checkpointed.

    Args:
      config: the ExperimentConfig.
      batch_size: samples per worker and step (fixed), or the sample count whose mean token count is the target.
      rank, size: this worker's share of the samples.
      balance: "tokens" or "none".
      position: a batching.StreamPosition to resume from (a checkpoint's, see `position_of_checkpoint`): the batches
        are those that followed it in the run that recorded it (same config, batch size, balance and worker count).
        None: the stream's start.
    """

    def __init__(self, config, batch_size, rank, size, balance, position=None):
        from tf_fusedrec.train import batching  # noqa: PLC0415

        if balance not in BALANCE_MODES:
            raise ValueError(f"--balance must be one of {BALANCE_MODES}, got {balance!r}")
        self.config, self.batch_size, self.rank, self.size, self.balance = config, batch_size, rank, size, balance
        # The target: batch_size x the mean length of this worker's first 4096 samples (deterministic; also when
        # resuming).
        first = [s["tokens"] for _, s in zip(range(4096), sequence_samples(config, rank, size,
                                                                           batch_size=batch_size))]
        self.target_tokens = max(1, int(round(batch_size * float(np.mean(first)))))
        self.start = batching.StreamPosition(0, 0) if position is None else batching.StreamPosition(*position)
        self.counts = []
        self._positions = []  # the StreamPosition after each batch made
        self._skipped = []  # a file source's bad records skipped (data.on_bad_record: skip) by each batch made
        self._reader = None  # a file source's FileBatches
        self.signature = sequence_signature(config)
        self._batching = batching

    def _samples(self):
        """sequence_samples from the start position, keeping a file source's reader (its count of skipped bad
        records)."""
        samples, self._reader = sequence_stream(self.config, self.rank, self.size, start=self.start.samples,
                                                batch_size=self.batch_size)
        return samples

    def _batches(self):
        samples = self._samples()
        if self.balance == "tokens":
            batcher = self._batching.TokenBatcher(self.target_tokens, tokens_of=lambda s: s["tokens"])
            cuts = batcher.cuts(samples, buffered=self.start.buffered)
        else:  # a fixed batch reads nothing past itself
            cuts = ((batch, 0) for batch in self._batching.fixed_batches(samples, self.batch_size))
        consumed = self.start.samples
        for batch, buffered in cuts:
            consumed += len(batch)
            self.counts.append((len(batch), sum(s["tokens"] for s in batch)))
            self._positions.append(self._batching.StreamPosition(consumed, buffered))
            # The reader reads ahead by at most a global batch of records: its count is of the records read so far.
            self._skipped.append(self._reader.skipped if self._reader is not None else 0)
            yield batch

    def dataset(self):
        """The batches from `position` on (iterate it once: the records describe one pass)."""
        return self._batching.to_dataset(self._batches, self.signature, label_key="labels")

    def position_after(self, batches):
        """The StreamPosition after the first `batches` batches of the dataset (those training has consumed by
        then, whatever tf.data made ahead of them)."""
        if batches == 0:
            return self.start
        if not 0 < batches <= len(self._positions):
            raise ValueError(f"position_after({batches}): {len(self._positions)} batches were made")
        return self._positions[batches - 1]

    def skipped_after(self, batches):
        """A file source's bad records skipped (data.on_bad_record: skip) in the records read by the time the first
        `batches` batches were cut, counted from the stream's start (a resumed run reads the records before its
        position again, and counts them again); 0 for the other sources."""
        return self._skipped[batches - 1] if batches else 0


def position_of_checkpoint(restored, rank, size):
    """This worker's batching.StreamPosition in a sequence run's checkpoint (what Checkpointer.restore returned).

    A sequence checkpoint resumes onto the worker count that wrote it only: worker r of N owns the samples r, r + N,
    ... of the stream and, with token-balanced batches, the workers have consumed different numbers of them, so no
    other split continues the same stream (neither the samples nor the steps of the uninterrupted run).

    Raises:
      ValueError: the checkpoint holds no stream positions, or was written by another worker count (naming both).
    """
    from tf_fusedrec.train import batching  # noqa: PLC0415

    positions = restored.get("stream_positions")
    if positions is None:
        raise ValueError(f"checkpoint {restored['directory']} holds no sample-stream positions (written before "
                         f"sequence runs could resume): a sequence config cannot continue from it; start a new "
                         f"--model-dir")
    if restored["workers"] != size or len(positions) != size:
        raise ValueError(f"checkpoint {restored['directory']} of a sequence config was written by "
                         f"{restored['workers']} worker(s), this run has {size}: a sequence run resumes onto the "
                         f"worker count that wrote it only (each worker continues its own sample stream); start "
                         f"{restored['workers']} worker(s), or a new --model-dir")
    return batching.StreamPosition(*positions[rank])


def global_mean_loss(comm):
    """The loss of a step whose workers hold different sample counts: binary cross-entropy on logits, summed over
    this worker's samples (the mean over tasks per sample) x N / the global sample count (one allreduce). With the
    grouped optimizer's average over workers, the update equals one worker's on the union of the batches with the
    global mean loss (train/weighting.py)."""
    from tf_fusedrec.train.weighting import GlobalMeanLoss  # noqa: PLC0415

    weighted = GlobalMeanLoss(comm, by="samples", name="FusedRec/balance/samples")

    def loss(labels, logits):
        per_sample = tf.keras.losses.binary_crossentropy(labels, logits, from_logits=True)
        if per_sample.shape.rank == 2:  # one label per sample: [B, 1] -> [B]
            per_sample = per_sample[:, 0]
        return weighted(per_sample, tf.ones_like(per_sample, tf.int64)).loss

    return loss


def global_weighted_mean_loss(comm):
    """The loss of a step with sample weights (data.schema.weight): binary cross-entropy on logits, the weighted mean
    over every worker's batch, ``sum(w * l) / sum(w)`` over the global batch. Each worker's loss is its ``sum(w * l)``
    x N / the global ``sum(w)`` (one allreduce): with the grouped optimizer's average over workers, the update equals
    one worker's on the union of the batches (train/weighting.py), so N workers train as one. A global batch whose
    weights are all 0 has the loss 0 and zero gradients.

    The loss takes ``labels`` float32 [B, 2]: the label and the sample weight of each sample (what the train app makes
    of the reader's (features, label, weight) batches), and logits [B] or [B, 1]."""
    from tf_fusedrec.distributed import comm as comm_lib  # noqa: PLC0415

    comm = comm_lib.get_comm(comm)

    def loss(labels, logits):
        labels = tf.convert_to_tensor(labels, tf.float32)
        label, weight = labels[:, 0], labels[:, 1]
        per_sample = tf.nn.sigmoid_cross_entropy_with_logits(labels=label,
                                                             logits=tf.reshape(tf.cast(logits, tf.float32), [-1]))
        total, = comm.allreduce([tf.reduce_sum(weight)], name="FusedRec/loss/weight_sum", op="sum")
        world = tf.cast(comm.size, tf.float32)
        return tf.math.divide_no_nan(tf.reduce_sum(weight * per_sample) * world, tf.stop_gradient(total))

    return loss


def embedding_sample(config, batch_size, rank, size, start_step, count):
    """This worker's embedding inputs (the batch dicts without "dense") of `count` batches from `start_step`: what
    the hot rows of a replicated FusedEmbedding are counted on."""
    from tf_fusedrec.models._blocks import sparse_inputs  # noqa: PLC0415

    return [sparse_inputs(f) for f, _ in make_dataset(config, batch_size, rank, size, start_step=start_step)
            .take(count)]


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
    """Exact ROC AUC (Mann-Whitney U; tied scores share their mean rank), vectorised: O(n log n) in NumPy."""
    labels = np.asarray(labels) > 0.5
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(np.asarray(scores, np.float64), return_inverse=True, return_counts=True)
    # The tie group of each distinct score holds 1-based ranks end - count + 1 .. end: its mean is end - (count-1)/2.
    mean_rank = np.cumsum(counts) - (counts - 1) / 2.0
    ranks = mean_rank[inverse.reshape(-1)]
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def evaluate(model, config, batch_size, rank, size, comm):
    """AUC over every worker's share of the held-out stream (config.data.eval_batches batches per worker); with
    several tasks (labels [B, T], the GRM's click and conversion), {task: AUC}."""
    scores, labels = [], []
    held_out = make_dataset(config, batch_size, rank, size, held_out=True).take(config.data.eval_batches)
    predict = tf.function(lambda f: tf.sigmoid(model(f, training=False)), autograph=False)
    for features_batch, y in held_out:
        scores.append(predict(features_batch).numpy())
        labels.append(y.numpy())
    scores = np.concatenate(scores) if scores else np.zeros(0)
    labels = np.concatenate(labels) if labels else np.zeros(0)
    if size > 1:
        scores = comm.allgather(tf.constant(scores, tf.float32), name="FusedRec/eval_scores").numpy()
        labels = comm.allgather(tf.constant(labels, tf.float32), name="FusedRec/eval_labels").numpy()
    if labels.ndim == 2:
        from tf_fusedrec.data.sequences import TASKS  # noqa: PLC0415

        names = TASKS if labels.shape[1] == len(TASKS) else [f"task{t}" for t in range(labels.shape[1])]
        return {name: auc(labels[:, t], scores[:, t]) for t, name in enumerate(names)}
    return auc(labels, scores)


def count_alltoall_ops(concrete_function):
    """All-to-all ops in a step's graph, nested functions (gradients) included."""
    graph = concrete_function.graph
    ops = list(graph.get_operations())
    for f in graph._functions.values():  # noqa: SLF001  (nested functions, e.g. gradients)
        ops.extend(f.graph.get_operations() if hasattr(f, "graph") else [])
    return sum(1 for op in ops if op.type == "HorovodAlltoall")


def binary_cross_entropy():
    """The loss of every model here: binary cross-entropy on logits, the mean over the (micro-)batch."""
    return tf.keras.losses.BinaryCrossentropy(from_logits=True)
