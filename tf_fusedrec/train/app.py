"""`python -m tf_fusedrec.train`: train a model from a configs/*.yaml, alone or under horovodrun.

    python -m tf_fusedrec.train --config configs/criteo_synthetic.yaml [--embedding fused|per_feature]
        [--pipeline sync|dbp|fwp] [--micro-batches K] [--cluster-samples] [--hot auto|R|0]
        [--table-storage float32|float16] [--evict-capacity N] [--admission-min-count N] [--expiry-steps N]
        [--dense-precision float32|mixed_float16|mixed_bfloat16]
        [--steps N] [--steps-per-call K]
        [--model-dir DIR] [--publish-to RANKER_HOST:PORT,... [--publish-every N]]
    horovodrun -np 2 -H localhost:2 --gloo python -m tf_fusedrec.train ...

Rank 0 shows a progress line (step, loss, samples/s over all workers; in place on a terminal, a line every
train.log_every steps in a log) without the launcher's prefix (train/progress.py), and ends with a short summary:
samples/s, AUC on a held-out stream, loss, all-to-all calls and bytes per step, where the checkpoint and the summary
JSON went. The summary JSON (every figure) goes to --summary-json, by default DIR/summary.json with --model-dir. The
step runs through fr.train.TrainPipeline with the chosen schedule (train/pipeline.py). With --model-dir, the workers checkpoint (train/checkpoint.py) every
`train.checkpoint_every` steps and at the end: each its shard of the embedding tables and optimizer slots (with
`train.checkpoint_full_every`, only the rows and slots changed since the previous checkpoint, between full ones), rank
0 the dense weights, published atomically as DIR/ckpt-{step}/ with a manifest of sha256 sums. A later run with the same
--model-dir resumes from the newest checkpoint every worker sees, with any number of workers, at the same data
position (batches are a function of (seed, rank, step)); a sequence config's batches are not (token-balanced ones hold
different sample counts), so its manifest holds each worker's position in its sample stream and the run resumes there,
on the worker count that wrote it only. Rank 0 writes TensorBoard summaries under DIR/tensorboard. With --publish-to,
every --publish-every steps and at the end the workers publish the model to running rankers and their embedding
servers as a new version (train/publishing.py, serve/publish.py).
"""

import argparse
import contextlib
import json
import os
import sys
import threading
import time
import types

import numpy as np
import tensorflow as tf

from tf_fusedrec import config as cfg
from tf_fusedrec.distributed import comm as comm_lib
from tf_fusedrec.train import experiment
from tf_fusedrec.train.checkpoint import Checkpointer
from tf_fusedrec.train.experiment import DEFAULT_CONFIG, EMBEDDINGS
from tf_fusedrec.train.pipeline import SCHEDULES
from tf_fusedrec.train.progress import Progress, open_console, summary_lines

# --steps-per-call's default: four steps a call ran the sync, dbp and fwp schedules 1.19-1.73x faster than one on
# this project's 2-core machines (docs/guide/performance.md), for about 0.4 s more tracing per process.
STEPS_PER_CALL = 4


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=DEFAULT_CONFIG, help="experiment YAML (default: configs/criteo_synthetic.yaml)")
    p.add_argument("--embedding", choices=EMBEDDINGS, default="fused",
                   help="the embedding layer: fused (FusedEmbedding, default), per_feature (one TFRA layer a feature, "
                        "the baseline; the [tfra] extra), or the ablations fused_nodedup and fused_source_hash")
    p.add_argument("--pipeline", choices=SCHEDULES, help="training schedule (default: the config's train.pipeline)")
    p.add_argument("--micro-batches", type=int, help="micro-batches per batch for --pipeline fwp "
                                                      "(default: the config's train.micro_batches)")
    p.add_argument("--cluster-samples", action="store_true", default=None,
                   help="key-centric sample clustering of the fwp micro-batches")
    p.add_argument("--hot", default="0",
                   help="hot-row replication of the fused embedding: 'auto' (R chosen per group by the cost model), "
                        "R (rows per group) or 0 (none, the default)")
    p.add_argument("--hot-sample-batches", type=int, default=100,
                   help="batches each worker counts to find the hot rows (default 100)")
    p.add_argument("--hot-repeek", action="store_true",
                   help="choose the hot rows anew at every checkpoint, from the batches that follow it (sync only)")
    p.add_argument("--table-backend", choices=cfg.TABLE_BACKENDS,
                   help="FusedEmbedding's tables (default: the config's embedding.table_backend): native (C++ table, "
                        "optimizer applied in place) or tfra (TFRA dynamic_embedding)")
    p.add_argument("--table-storage", choices=("float32", "float16"), default="float32",
                   help="how the fused embedding stores its sharded rows: float16 halves the row bytes (lookups and "
                        "optimizer math stay float32; replicated hot rows, --hot, stay float32: mixed precision)")
    p.add_argument("--table-rounding", choices=cfg.TABLE_ROUNDINGS,
                   help="how --table-storage float16 rounds a row after each update (default: the config's "
                        "embedding.table_rounding, nearest): nearest loses updates under half a float16 step; "
                        "stochastic rounds up or down at random, unbiased (float32 storage ignores it)")
    p.add_argument("--dense-precision", choices=("float32", "mixed_float16", "mixed_bfloat16"), default="float32",
                   help="Keras dtype policy of the dense layers: mixed_float16 computes in float16 with float32 "
                        "weights and a dynamic loss scale; mixed_bfloat16 needs no scale (tables stay float32 or "
                        "--table-storage; on CPUs without AVX-512 float16 runs slower, not faster)")
    p.add_argument("--evict-capacity", type=int,
                   help="bound each worker's table of every group of the fused embedding to this many rows, "
                        "evicting by --evict-policy every --evict-interval steps (default: tables grow)")
    p.add_argument("--evict-policy", choices=("lfu", "lru"), default="lfu",
                   help="which rows go first: the least frequently (lfu) or least recently (lru) read")
    p.add_argument("--evict-interval", type=int, default=100, help="steps between evictions (default 100)")
    p.add_argument("--admission-min-count", type=int,
                   help="an id of the fused embedding gets a trainable row only once it has been read this many times "
                        "(until then: its initializer's row, gradient dropped; default: the config's "
                        "embedding.admission_min_count, else every id at once)")
    p.add_argument("--expiry-steps", type=int,
                   help="rows of the fused embedding not updated for this many steps are removed, checked every "
                        "--expiry-interval steps (default: the config's embedding.expiry_steps, else rows stay)")
    p.add_argument("--tier-dram-bytes",
                   help="tables larger than memory: each table keeps at most this much per worker in DRAM (bytes or a "
                        "size such as 2GiB) and the rest in a RocksDB store under --tier-path (default: the config's "
                        "embedding.tier, else every row in DRAM)")
    p.add_argument("--tier-path", help="the local directory of the tiered tables' on-disk stores (with "
                                       "--tier-dram-bytes)")
    p.add_argument("--expiry-interval", type=int,
                   help="steps between expiry checks (default: the config's embedding.expiry_interval, 100)")
    p.add_argument("--balance", choices=("tokens", "none"),
                   help="sequence configs (data.source grm_synthetic or movielens_seq, or files with "
                        "data.sequences): token-balanced batches whose token count is closest to batch size x the mean "
                        "sequence length (MTGRBoost; the default), or a fixed sample count per worker (none)")
    p.add_argument("--steps", type=int, help="override train.steps")
    p.add_argument("--steps-per-call", type=int, default=STEPS_PER_CALL, metavar="K",
                   help="training steps run inside one call of the compiled step function, which reads its batches "
                        f"from the dataset itself (default {STEPS_PER_CALL}): the per-call Python cost (argument "
                        "packing of the features, the next batch) is paid once per K steps, which helps when it is "
                        "a noticeable part of a short step (small batches, many features, CPU). The same training "
                        "at any K (1: a call per step); a "
                        "call ends early at --steps and at every log and checkpoint step, so a K that divides "
                        "train.log_every and train.checkpoint_every keeps all calls K steps long")
    p.add_argument("--batch-size", type=int, help="override train.batch_size (per worker)")
    p.add_argument("--model-dir", help="checkpoints and TensorBoard summaries; resumes from it when it has a checkpoint")
    p.add_argument("--publish-to",
                   help="rankers' publish endpoints host:port,... (python -m tf_fusedrec.serve.ranker --publish-port): "
                        "every --publish-every steps and at the end the model goes to them and their embedding "
                        "servers as a new version (the rows changed since the last one; the first one whole)")
    p.add_argument("--publish-every", type=int, default=100,
                   help="steps between published versions (default 100; with --publish-to)")
    p.add_argument("--publish-log", metavar="DIR",
                   help="with --publish-to: also write each published version here (the workers' rows, the dense "
                        "weights), so that servers and rankers started later catch up (--catch-up DIR); on several "
                        "hosts a file system every worker writes")
    p.add_argument("--publish-timeout-s", type=float, default=60.0,
                   help="deadline of each call to a server or ranker while publishing (default 60)")
    from tf_fusedrec.serve import security  # noqa: PLC0415  (ssl and hmac only: no gRPC)

    security.add_publish_auth_flags(p, server=False)
    security.add_tls_flags(p, server=False)
    p.add_argument("--no-progress", action="store_true",
                   help="a progress line every train.log_every steps, also on a terminal (default: one line updated "
                        "in place on a terminal)")
    p.add_argument("--summary-json", metavar="FILE",
                   help="rank 0 writes the run's summary here as JSON, every figure (default: DIR/summary.json with "
                        "--model-dir DIR, else none)")
    p.add_argument("--step-timeout", type=float, default=600.0,
                   help="seconds a training step or checkpoint may take before this worker gives up (a lost or "
                        "stalled peer; horovodrun itself stops the job when a worker dies); 0: no limit")
    return p.parse_args(argv)


def parse_hot(value):
    """--hot: "auto" or a number of rows >= 0."""
    if value == "auto":
        return value
    try:
        rows = int(value)
    except ValueError:
        rows = -1
    if rows < 0:
        raise ValueError(f"--hot must be auto or a number of rows >= 0, got {value!r}")
    return rows


def replication_of(args):
    """The FusedEmbedding replication argument of --hot and --hot-sample-batches (None: no replication)."""
    from tf_fusedrec.distributed.replication import HotReplication  # noqa: PLC0415

    hot = parse_hot(args.hot)
    if hot == 0:
        if args.hot_repeek:
            raise ValueError("--hot-repeek needs --hot auto or R > 0")
        return None
    if args.embedding not in ("fused", "fused_nodedup"):
        raise ValueError(f"--hot needs --embedding fused (or fused_nodedup), got {args.embedding}")
    return HotReplication(rows=None if hot == "auto" else hot, sample_batches=args.hot_sample_batches)


def report_hot(reports, console, what):
    """Writes the hot sets chosen or re-peeked on rank 0's console (other ranks' write nothing)."""
    for r in reports:
        predicted = "" if r["predicted_seconds"] is None else (
            f", predicted {1e3 * r['predicted_seconds']:.2f} ms/step of communication vs "
            f"{1e3 * r['seconds_without']:.2f} ms without")
        console.line(f"hot rows ({what}) {r['group']}: R={r['rows']} ({r['chosen_by']}) of {r['candidates']} counted, "
                     f"covering rho={r['rho']:.3f} of the accesses{predicted}")


class Watchdog:
    """Ends this worker with exit status 3 and an error line when a guarded block (a step, a checkpoint) runs past
    `seconds`: the bound on how long a worker waits in a collective for a peer that died or stalls, whatever launched
    it (horovodrun already terminates the other workers when one dies and names it; other launchers may not)."""

    def __init__(self, seconds, rank):
        self.seconds, self.rank = seconds, rank
        self._deadline, self._what, self._limit = None, "", seconds
        if seconds > 0:
            threading.Thread(target=self._watch, name="fusedrec-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def guard(self, what, steps=1):
        """Bounds the block to `steps` times the seconds of one step (a call of several steps gets each its own)."""
        self._what, self._limit = what, self.seconds * steps
        self._deadline = time.monotonic() + self._limit
        try:
            yield
        finally:
            self._deadline = None

    def extend(self):
        """Restarts the guarded block's time: a followed stream waiting for files (data.follow) is not a stall."""
        if self._deadline is not None:
            self._deadline = time.monotonic() + self._limit

    def _watch(self):
        while True:
            time.sleep(min(1.0, self.seconds))
            deadline = self._deadline
            if deadline is not None and time.monotonic() > deadline:
                print(f"error: rank {self.rank}: {self._what} did not finish within {self._limit:g} s (--step-timeout): "
                      f"a peer worker died or stalls; the launcher's log names it", file=sys.stderr, flush=True)
                os._exit(3)


def call_length(done, steps_per_call, last, ends=(), every=()):
    """How many steps the next call runs after step `done`: steps_per_call, shortened so that no call runs past
    step `last` or past the next of the steps `ends`, nor past the next multiple of each of `every` (the steps that
    log and checkpoint): each of them then ends a call, so what happens at it sees the state after exactly that step."""
    n = min(steps_per_call, last - done)
    for end in ends:
        if end > done:
            n = min(n, end - done)
    for period in every:
        n = min(n, period - done % period)
    return n


def mean_over_workers(comm, losses, samples):
    """The loss of each step over every worker's samples (float64 [n]), from this worker's losses (float [n], one per
    step) weighted by `samples`: how many samples each is the mean over (the local batch size; 1 where the loss is
    already normalised by the global sample count, experiment.global_mean_loss). One small allreduce through the
    comm; with one worker, the losses themselves."""
    if comm.size == 1:
        return np.asarray(losses, np.float64)
    weighted = np.append(np.asarray(losses, np.float64) * samples, float(samples))
    total, = comm.allreduce([tf.constant(weighted)], name="FusedRec/summary/loss", op="sum")
    total = total.numpy()
    return total[:-1] / total[-1]


def schedule_of(args, config, embedding_kind):
    """(schedule, micro_batches, cluster_samples) from the flags, else the config; per_feature trains with sync."""
    schedule = args.pipeline or config.train.pipeline
    micro = args.micro_batches if args.micro_batches is not None else config.train.micro_batches
    cluster = args.cluster_samples if args.cluster_samples is not None else config.train.cluster_samples
    if embedding_kind == "per_feature" and schedule != "sync":
        if args.pipeline:
            raise ValueError(f"--pipeline {schedule} needs a FusedEmbedding; --embedding per_feature trains with sync")
        schedule = "sync"
    if schedule != "fwp":
        micro, cluster = 1, False
    if isinstance(micro, bool) or micro < 1:
        raise ValueError(f"--micro-batches must be >= 1, got {micro}")
    return schedule, micro, bool(cluster)


def plan_of(args, config):
    """Every check of the flags against each other and the config, before any worker starts or anything is built:
    -> what the run does (a namespace). A flag that does not fit raises ValueError naming it."""
    import tf_fusedrec as fr  # noqa: PLC0415

    steps = args.steps if args.steps is not None else config.train.steps
    batch_size = args.batch_size if args.batch_size is not None else config.train.batch_size
    if steps <= 0 or batch_size <= 0:
        raise ValueError("--steps and --batch-size must be positive")
    if args.steps_per_call < 1:
        raise ValueError(f"--steps-per-call must be >= 1, got {args.steps_per_call}")
    schedule, micro_batches, cluster = schedule_of(args, config, args.embedding)
    sequences = config.data.sequential
    balance = args.balance or ("tokens" if sequences else "none")
    if balance == "tokens" and not sequences:
        raise ValueError(f"--balance tokens needs a sequence config (data.source in {cfg.SEQUENCE_SOURCES}, or a file "
                         f"source with data.sequences), {args.config} has data.source: {config.data.source}")
    if sequences and schedule == "fwp":
        raise ValueError("--pipeline fwp weights micro-batches by their local size; with a sequence config (workers "
                         "holding different sample counts) use --pipeline sync or dbp")
    weighted = config.data.source in cfg.FILE_SOURCES and config.data.schema.weight is not None
    if weighted and micro_batches > 1:
        raise ValueError(f"--micro-batches {micro_batches} weights micro-batches by their size; with sample weights "
                         f"(data.schema.weight: {config.data.schema.weight}) use --micro-batches 1")
    replication = replication_of(args)
    if args.hot_repeek and schedule != "sync":
        raise ValueError(f"--hot-repeek needs --pipeline sync (a {schedule} pipeline holds a batch in flight across "
                         f"the checkpoint, routed by the old hot set)")
    if args.table_backend == "native" and args.embedding == "per_feature":
        raise ValueError("--table-backend native needs a fused --embedding: per_feature is the TFRA baseline")
    if args.table_storage != "float32" and args.embedding == "per_feature":
        raise ValueError(f"--table-storage {args.table_storage} needs a fused --embedding, got per_feature")
    eviction = None
    if args.evict_capacity is not None:
        if args.embedding == "per_feature":
            raise ValueError("--evict-capacity needs a fused --embedding, got per_feature")
        eviction = fr.Eviction(capacity=args.evict_capacity, policy=args.evict_policy, interval=args.evict_interval)
    admission, expiry = table_policies_of(args, config)
    return types.SimpleNamespace(steps=steps, batch_size=batch_size, schedule=schedule, micro_batches=micro_batches,
                                 cluster=cluster, sequences=sequences, balance=balance, replication=replication,
                                 eviction=eviction, admission=admission, expiry=expiry, weighted=weighted,
                                 tier=tier_of(args, config))


def tier_of(args, config):
    """The fused embedding's fr.Tiered, or None: --tier-dram-bytes and --tier-path (both), else the config's
    embedding.tier."""
    from tf_fusedrec.distributed.tier import Tiered, parse_bytes, parse_tier  # noqa: PLC0415

    if (args.tier_dram_bytes is None) != (args.tier_path is None):
        raise ValueError("--tier-dram-bytes and --tier-path go together (tables larger than memory)")
    if args.tier_dram_bytes is not None:
        tier = Tiered(parse_bytes(args.tier_dram_bytes, "--tier-dram-bytes"), args.tier_path)
    else:
        tier = parse_tier(config.embedding.tier, f"{args.config}: embedding")
    if tier is None:
        return None
    if args.embedding == "per_feature":
        raise ValueError("--tier-dram-bytes (tiered tables) needs a fused --embedding, got per_feature")
    backend = args.table_backend or config.embedding.table_backend
    if backend != "native":
        raise ValueError(f"tiered tables need --table-backend native, got {backend}")
    return tier


def table_policies_of(args, config):
    """(fr.Admission or None, fr.Expiry or None) of the fused embedding: the flags, else the config's embedding keys
    (which the per-feature baseline, always plain TFRA tables, does not take)."""
    import tf_fusedrec as fr  # noqa: PLC0415

    for flag, value in (("--admission-min-count", args.admission_min_count), ("--expiry-steps", args.expiry_steps),
                        ("--expiry-interval", args.expiry_interval)):
        if value is None:
            continue
        if args.embedding == "per_feature":
            raise ValueError(f"{flag} needs a fused --embedding, got per_feature")
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    embedding = config.embedding
    min_count = args.admission_min_count if args.admission_min_count is not None else embedding.admission_min_count
    steps = args.expiry_steps if args.expiry_steps is not None else embedding.expiry_steps
    interval = args.expiry_interval if args.expiry_interval is not None else embedding.expiry_interval
    if args.expiry_interval is not None and steps is None:
        raise ValueError("--expiry-interval needs --expiry-steps (or the config's embedding.expiry_steps)")
    if args.embedding == "per_feature":
        return None, None
    return (None if min_count is None else fr.Admission(min_count),
            None if steps is None else fr.Expiry(steps, interval=interval))


class _TrainingRun:
    """The state one `run(args)` builds up, and its stages as methods, in the order run() calls them. Every worker
    runs the same stages in the same order: their collectives meet, and the variables get the same names."""

    def __init__(self, args, config, plan):
        self.args, self.config, self.plan = args, config, plan

    def start_workers(self):
        """Starts the workers' comm, the step watchdog and, with more than one worker, the all-to-all meter."""
        self.comm = comm_lib.init_workers()
        comm_lib.overlap_collectives()  # collectives and the meter's stamps run when their inputs allow, not in order
        self.rank, self.size = self.comm.rank, self.comm.size
        self.console = open_console(self.rank, in_place=not self.args.no_progress)
        self.watchdog = Watchdog(self.args.step_timeout if self.size > 1 else 0, self.rank)
        from tf_fusedrec.distributed.meter import AlltoallMeter  # noqa: PLC0415

        self.meter = AlltoallMeter() if self.size > 1 else None

    def build_model(self):
        """Builds the embedding, the model, its optimizer and the global step variable, in this order."""
        import tf_fusedrec as fr  # noqa: PLC0415

        args, config, plan, comm, meter = self.args, self.config, self.plan, self.comm, self.meter
        features = config.embedding_features()
        self.embedding = experiment.make_embedding(args.embedding, features, config,
                                                   comm=meter.wrap(comm) if meter is not None else comm,
                                                   replication=plan.replication, storage=args.table_storage,
                                                   eviction=plan.eviction, table_backend=args.table_backend,
                                                   admission=plan.admission, expiry=plan.expiry,
                                                   rounding=args.table_rounding, tier=plan.tier)
        if args.dense_precision != "float32":
            tf.keras.mixed_precision.set_global_policy(args.dense_precision)
        self.model = experiment.make_model(config, self.embedding)
        self.optimizer = fr.train.make_optimizer(self.model, default=config.train.dense_optimizer)
        self.step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")

    def refuse_old_checkpoints(self):
        """Refuses a --model-dir that holds checkpoints of the old per-rank format."""
        model_dir = self.args.model_dir
        if model_dir:
            old = [d for d in os.listdir(model_dir) if d.startswith("rank") and "-of-" in d] \
                if os.path.isdir(model_dir) else []
            if old:
                raise ValueError(f"--model-dir {model_dir} holds checkpoints of the old per-rank format ({old[0]}); "
                                 f"use a new directory")

    def build_dense_weights(self):
        """Builds the dense weights on a first batch (checking its features against the config) before a restore."""
        config = self.config
        dataset = experiment.make_dataset(config, self.plan.batch_size, self.rank, self.size)
        sample = next(iter(dataset.take(1)), None)
        if sample is None:  # a followed directory (data.follow) that stayed empty past data.idle_timeout_seconds
            raise ValueError(f"data.path: no batch to train on under {config.data.path!r}")
        sample = sample[0]
        experiment.check_features_match(config, sample)
        self.model(sample, training=False)

    def restore_checkpoint(self):
        """Restores --model-dir's newest checkpoint, if any (start step, stream position); refuses one at --steps."""
        args, comm, rank, size = self.args, self.comm, self.rank, self.size
        self.checkpointer = None
        if args.model_dir:
            self.checkpointer = Checkpointer(args.model_dir, self.model, self.optimizer, self.step_var, comm, keep=2,
                                             config_name=self.config.name,
                                             full_every=self.config.train.checkpoint_full_every)
        self.restored = None
        if self.checkpointer is not None:
            with self.watchdog.guard("restoring the checkpoint"):
                self.restored = self.checkpointer.restore()
        restored, self.start = self.restored, 0
        if restored is not None:
            self.start = restored["step"]
            self.bytes_read = comm.allgather(tf.constant([restored["bytes_read"]], tf.int64),
                                             name="FusedRec/checkpoint/bytes_read").numpy().tolist()
            self.console.line(f"resumed from {restored['directory']} at step {self.start} (written by "
                              f"{restored['workers']} worker(s), restored onto {size}); bytes read per rank: "
                              f"{self.bytes_read}")
        self.position = None  # a sequence run's: where this worker's batches stand in its sample stream
        if restored is not None and self.plan.sequences:
            self.position = experiment.position_of_checkpoint(restored, rank, size)
        elif restored is not None and self.config.data.source in cfg.FILE_SOURCES:  # resumes on any worker count
            self.position = experiment.position_of_file_checkpoint(restored)
        if self.start >= self.plan.steps:
            raise ValueError(f"--model-dir is already at step {self.start} >= --steps {self.plan.steps}; "
                             f"ask for more steps")

    def connect_publisher(self):
        """With --publish-to: asks the rankers for their embedding servers and checks the model fits theirs."""
        self.publisher = None
        args = self.args
        if args.publish_log and not args.publish_to:
            raise ValueError("--publish-log needs --publish-to (it logs the versions published)")
        if args.publish_to:
            from tf_fusedrec.serve import publish, security  # noqa: PLC0415
            from tf_fusedrec.train.publishing import TrainingPublisher  # noqa: PLC0415

            if args.publish_log:
                os.makedirs(args.publish_log, exist_ok=True)
            if args.publish_every < 1:
                raise ValueError(f"--publish-every must be >= 1, got {args.publish_every}")
            rankers = [a.strip() for a in args.publish_to.split(",") if a.strip()]
            tls = security.TLS.from_args(args)
            token = security.read_token(args.publish_token_file) if args.publish_token_file else None
            try:
                self.publisher = TrainingPublisher(self.model, self.comm, rankers, timeout_s=args.publish_timeout_s,
                                                   log_dir=args.publish_log, tls=tls, token=token)
            except publish.PublishError as e:
                raise ValueError(f"--publish-to: {e}") from None

    def choose_hot_set(self):
        """Chooses the replicated hot rows from a sample of the coming batches (a restore brought its own back)."""
        replication = self.plan.replication
        self.hot_reports = None
        if replication is not None and self.restored is None:  # a restore brings its hot sets back
            from tf_fusedrec.distributed import replication as replication_lib  # noqa: PLC0415

            self.hot_reports = replication_lib.choose_hot_set(
                self.embedding, experiment.embedding_sample(self.config, self.plan.batch_size, self.rank, self.size,
                                                            self.start, replication.sample_batches))
            report_hot(self.hot_reports, self.console, "chosen")

    def make_pipeline(self):
        """Makes the batches from the start step (or the stream position), the loss and the TrainPipeline."""
        import tf_fusedrec as fr  # noqa: PLC0415

        args, config, plan, comm = self.args, self.config, self.plan, self.comm
        # Endless: the pipeline prefetches one batch past the last step (its ids only; no table changes).
        loss_fn = experiment.binary_cross_entropy()
        self.sequence_batches = self.file_batches = None
        if plan.sequences:
            self.sequence_batches = experiment.SequenceBatches(config, plan.batch_size, self.rank, self.size,
                                                               plan.balance, position=self.position)
            dataset = self.sequence_batches.dataset()
            loss_fn = experiment.global_mean_loss(comm)
        elif config.data.source in cfg.FILE_SOURCES:  # its position after each batch goes into the checkpoints
            self.wait_shown = float("inf")  # when _waiting last showed a wait (a smaller time: a new wait)
            self.file_batches = experiment.file_batches(config, plan.batch_size, self.rank, self.size,
                                                        position=self.position, comm=comm, on_wait=self._waiting)
            dataset = self.file_batches.dataset()
            if plan.weighted:  # (features, label, weight) -> labels [B, 2]: the label and the weight, for the loss
                dataset = dataset.map(lambda features, label, weight: (features, tf.stack([label, weight], axis=1)))
                loss_fn = experiment.global_weighted_mean_loss(comm)
        else:
            dataset = experiment.make_dataset(config, plan.batch_size, self.rank, self.size, start_step=self.start)
        self.loss_scale = fr.train.DynamicLossScale(comm) if args.dense_precision == "mixed_float16" else None
        self.pipe = fr.train.TrainPipeline(self.model, self.optimizer, loss_fn, dataset, schedule=plan.schedule,
                                           micro_batches=plan.micro_batches, cluster_samples=plan.cluster,
                                           step_counter=self.step_var, meter=self.meter, loss_scale=self.loss_scale,
                                           steps_per_call=args.steps_per_call)

    def _waiting(self, seconds):
        """A followed stream (data.follow) polls for new files, `seconds` into a wait: the watchdog waits on; rank 0
        shows it (every poll in place on a terminal, else at a wait's first poll and every 30 s)."""
        self.watchdog.extend()
        if self.console.tty or seconds < self.wait_shown or seconds >= self.wait_shown + 30:
            self.wait_shown = seconds
            self.console.update(f"waiting for new files under {self.config.data.path} ({seconds:.0f} s)")

    def train(self):
        """Trains to --steps in calls of steps: progress, TensorBoard scalars, table rows, checkpoints, re-peeks."""
        args, config, steps, start = self.args, self.config, self.plan.steps, self.start
        self.writer = tf.summary.create_file_writer(os.path.join(args.model_dir, "tensorboard")) \
            if args.model_dir and self.rank == 0 else None
        progress = Progress(self.console, steps, config.train.log_every, start=start)
        warmup = min(3, steps - start - 1)
        self.timed_steps, self.timed_seconds, loss_value = 0, 0.0, float("nan")
        self.table_rows = []  # (step, this worker's embedding rows) at each log step: the table size over time
        # Calls end at the last warm-up step (the timing starts after it) and at every log and checkpoint step.
        every = [config.train.log_every] + ([config.train.checkpoint_every] if self.checkpointer is not None else []) \
            + ([args.publish_every] if self.publisher is not None else [])
        step, self.stream_ended = start, None
        while step < steps:
            if step == start + warmup and self.meter is not None:
                self.meter.reset()
            n = call_length(step, args.steps_per_call, steps, ends=[start + warmup], every=every)
            try:
                losses, elapsed = self._call(step, n)
            except StopIteration:  # a followed stream stayed idle past data.idle_timeout_seconds: the run ends here
                if not config.data.follow:  # the other streams are endless
                    raise
                self._stream_ended(step, loss_value)
                break
            if step >= start + warmup:
                self.timed_steps += len(losses)
                self.timed_seconds += elapsed
            for loss_value in losses.tolist():
                step += 1
                skipped = self._skipped_after(step - start)
                progress.update(step, loss_value, self.plan.batch_size * self.size * len(losses) / max(elapsed, 1e-9),
                                skipped=skipped)
            if step % config.train.log_every == 0 or step == steps:
                self._log(step, loss_value)
            if self.checkpointer is not None and (step % config.train.checkpoint_every == 0 or step == steps):
                self._checkpoint(step)
            if self.publisher is not None and (step % args.publish_every == 0 or step == steps):
                self._publish(step)
        self.final_loss, self.end_step = loss_value, step

    def _skipped_after(self, batches):
        """The bad records skipped (data.on_bad_record: skip) by the end of the run's first `batches` batches, in
        all (the count since the stream's start); 0 for the built-in sources."""
        if self.file_batches is not None:
            return self.file_batches.position_after(batches).skipped
        return self.sequence_batches.skipped_after(batches) if self.sequence_batches is not None else 0

    def _stream_ended(self, step, loss_value):
        """Ends training at step `step`, where the followed stream ended: logs, checkpoints and publishes it."""
        args, config = self.args, self.config
        self.stream_ended = step
        self.console.line(f"no new file under {config.data.path} for {config.data.idle_timeout_seconds:g} s "
                          f"(data.idle_timeout_seconds): training ends at step {step} of {self.plan.steps}")
        if step == self.start:
            raise ValueError(f"data.path: no new batch under {config.data.path!r} to train on after step {step}")
        if step % config.train.log_every:
            self._log(step, loss_value)
        if self.checkpointer is not None and step % config.train.checkpoint_every:
            self._checkpoint(step)
        if self.publisher is not None and step % args.publish_every:
            self._publish(step)

    def _publish(self, step):
        """Publishes the model of step `step`, with a file source's stream position after it: the records (a followed
        directory's files) the version has learnt from, in the summary's "published" section."""
        position = self.file_batches.position_after(step - self.start) if self.file_batches is not None else None
        with self.watchdog.guard(f"publishing step {step}"):
            self.publisher.publish(step, stream_position=position)

    def _call(self, step, n):
        """Runs the `n` steps after `step` in one call: -> (each step's loss over all workers, the call's seconds)."""
        t0 = time.perf_counter()
        with self.watchdog.guard(f"step {step + 1}" if n == 1 else f"steps {step + 1} to {step + n}", steps=n):
            losses = self.pipe.progress_many(n).numpy()
        elapsed = time.perf_counter() - t0
        with self.watchdog.guard(f"step {step + len(losses)} (the allreduce of its loss)"):
            # A loss over the global batch already (sequences, sample weights) counts 1; a local mean its samples.
            global_loss = self.plan.sequences or self.plan.weighted
            losses = mean_over_workers(self.comm, losses, 1 if global_loss else self.plan.batch_size)
        return losses, elapsed

    def _log(self, step, loss_value):
        """Notes this worker's table rows at log step `step`; rank 0 writes the step's TensorBoard scalars."""
        self.table_rows.append((step, experiment.table_rows(self.embedding)))
        if self.writer is not None:
            with self.writer.as_default(step=step):
                tf.summary.scalar("loss", loss_value)
                tf.summary.scalar("table_rows/rank0", self.table_rows[-1][1])
                for name, stats in self.embedding.statistics().items():
                    for stat, value in stats.items():
                        tf.summary.scalar(f"features/{name}/{stat}", value)

    def _checkpoint(self, step):
        """Writes the checkpoint of step `step`, with --hot-repeek first choosing the hot rows anew."""
        args, steps, start = self.args, self.plan.steps, self.start
        if args.hot_repeek and step < steps:
            from tf_fusedrec.distributed import replication as replication_lib  # noqa: PLC0415

            with self.watchdog.guard(f"the re-peek of step {step}"):
                sample = experiment.embedding_sample(self.config, self.plan.batch_size, self.rank, self.size, step,
                                                     self.plan.replication.sample_batches)
                self.hot_reports = replication_lib.repeek(self.embedding, sample, self.optimizer)
            report_hot(self.hot_reports, self.console, f"re-peeked at step {step}")
        with self.watchdog.guard(f"the checkpoint of step {step}"):
            batches = self.sequence_batches or self.file_batches
            self.checkpointer.save(stream_position=batches.position_after(step - start) if batches else None)

    def summarize(self):
        """The run's summary (a dict whose keys keep the order the JSON shows), the held-out AUC last."""
        args, plan, comm, size = self.args, self.plan, self.comm, self.size
        timed_steps, timed_seconds = self.timed_steps, self.timed_seconds
        result = {
            "config": self.config.name,
            "embedding": args.embedding,
            "pipeline": plan.schedule,
            "micro_batches": plan.micro_batches,
            "cluster_samples": plan.cluster,
            "steps_per_call": args.steps_per_call,
            "workers": size,
            # TensorFlow's allocator for host tensors: "bfc" where TF_CPU_ALLOCATOR_USE_BFC is on (the app's default,
            # tf_fusedrec/train/__main__.py), else "default".
            "cpu_allocator": "bfc" if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() in ("1", "true")
                             else "default",
            "batch_size_per_worker": plan.batch_size,
            "steps": plan.steps,
            "final_loss": self.final_loss,
            "samples_per_s": plan.batch_size * size * timed_steps / timed_seconds if timed_seconds else float("nan"),
            "alltoall_ops_in_step_graph": experiment.count_alltoall_ops(self.pipe.concrete_step()),
        }
        if self.meter is not None:
            result.update(self.meter.per_step(timed_steps))
        result["dense_precision"] = args.dense_precision
        if self.loss_scale is not None:
            result["loss_scale"] = {"final": float(self.loss_scale.scale.numpy()),
                                    "skipped_steps": int(self.loss_scale.skipped.numpy())}
        self._summarize_tables(result)
        if plan.eviction is not None:
            self._summarize_eviction(result)
        if plan.tier is not None:
            self._summarize_tier(result, plan.steps - self.start)
        if plan.admission is not None:
            self._summarize_admission(result)
        if plan.expiry is not None:
            self._summarize_expiry(result)
        if plan.replication is not None:
            self._summarize_hot(result)
        if plan.sequences:
            self._summarize_balance(result)
        if self.restored is not None:
            self._summarize_restored(result)
        if self.checkpointer is not None:
            result["checkpoints"] = self.checkpointer.written_summary()
        if self.publisher is not None:
            result["published"] = self.publisher.summary()
            self.publisher.close()
        if self.config.data.source in cfg.FILE_SOURCES:  # the bad records skipped (data.on_bad_record: skip)
            result["bad_records_skipped"] = self._skipped_after(self.end_step - self.start)
        if self.stream_ended is not None:  # data.follow: the stream ended before --steps
            result["stream_ended_at_step"] = self.stream_ended
        result["auc"] = experiment.evaluate(self.model, self.config, plan.batch_size, self.rank, size, comm)
        return result

    def _summarize_tables(self, result):
        """Adds the tables' storage, backend, bytes per worker and every worker's rows at each log step."""
        result["table_storage"] = self.args.table_storage
        result["table_backend"] = self.embedding.table_backend
        result["table_bytes_per_worker"] = experiment.table_bytes(self.embedding, self.optimizer, self.comm)
        everyone = self.comm.allgather(tf.constant([[n for _, n in self.table_rows]], tf.int64),
                                       name="FusedRec/summary/table_rows").numpy()
        result["table_rows_over_time"] = {"steps": [s for s, _ in self.table_rows],
                                          "rows_per_worker": everyone.tolist()}

    def _summarize_tier(self, result, steps_run):
        """Adds the tiers: each worker's rows in DRAM and on disk, DRAM hit rate of the lookups of existing rows, and
        the disk bytes read and written per step (over this run's steps), summed over the groups' tables."""
        names = ("dram_rows", "disk_rows", "hits", "disk_hits", "new_keys", "evicted_rows", "bytes_read",
                 "bytes_written")
        mine = [[sum(s[n] for s in self.embedding.tier_statistics().values()) for n in names]]
        everyone = self.comm.allgather(tf.constant(mine, tf.int64), name="FusedRec/summary/tier").numpy()
        per_worker = {n: everyone[:, i].tolist() for i, n in enumerate(names)}
        hits, disk_hits = sum(per_worker["hits"]), sum(per_worker["disk_hits"])
        steps_run = max(steps_run, 1)
        result["tier"] = {"dram_bytes": self.plan.tier.dram_bytes, "path": self.plan.tier.path,
                          "per_worker": per_worker,
                          "hit_rate": hits / (hits + disk_hits) if hits + disk_hits else 1.0,
                          "disk_bytes_read_per_step": sum(per_worker["bytes_read"]) / steps_run,
                          "disk_bytes_written_per_step": sum(per_worker["bytes_written"]) / steps_run}

    def _summarize_eviction(self, result):
        """Adds the eviction's settings and the rows each worker evicted."""
        eviction = self.plan.eviction
        result["eviction"] = {"capacity": eviction.capacity, "policy": eviction.policy,
                              "interval": eviction.interval, "evicted_per_worker": self.comm.allgather(
                                  tf.constant([[experiment.evicted_rows(self.embedding)]], tf.int64),
                                  name="FusedRec/summary/evicted").numpy()[:, 0].tolist()}

    def _summarize_admission(self, result):
        """Adds the admission's min count and each worker's dropped gradients and waiting keys."""
        stats = [[s[k] for s in self.embedding.admission_statistics().values() for k in ("dropped", "waiting")]]
        everyone = self.comm.allgather(tf.constant(stats, tf.int64), name="FusedRec/summary/admission").numpy()
        result["admission"] = {"min_count": self.plan.admission.min_count,
                               "dropped_gradients_per_worker": everyone[:, 0::2].sum(axis=1).tolist(),
                               "waiting_keys_per_worker": everyone[:, 1::2].sum(axis=1).tolist()}

    def _summarize_expiry(self, result):
        """Adds the expiry's settings and the rows each worker's tables expired."""
        expired = [[sum(s["expired"] for s in self.embedding.expiry_statistics().values())]]
        everyone = self.comm.allgather(tf.constant(expired, tf.int64), name="FusedRec/summary/expired").numpy()
        result["expiry"] = {"steps": self.plan.expiry.steps, "interval": self.plan.expiry.interval,
                            "expired_per_worker": everyone[:, 0].tolist()}

    def _summarize_hot(self, result):
        """Adds the hot sets (as chosen or re-peeked, else restored) and each feature's hot hits per step."""
        embedding = self.embedding
        result["hot"] = self.hot_reports if self.hot_reports is not None else [
            {"group": g.name, "rows": len(h), "chosen_by": "restored"} for g, h in zip(embedding.groups,
                                                                                      embedding.hot_sets)]
        result["hot_hits_per_step"] = {n: int(s["hot_hits"]) for n, s in embedding.statistics().items()}

    def _summarize_balance(self, result):
        """Adds a sequence run's balance: token imbalance, samples and tokens per worker, the timed rates."""
        from tf_fusedrec.train import balance_metrics as balance_lib  # noqa: PLC0415

        plan, comm, sequence_batches = self.plan, self.comm, self.sequence_batches
        counts = np.asarray(sequence_batches.counts[:plan.steps - self.start], np.int64)  # [steps, (samples, tokens)]
        everyone = comm.allgather(tf.constant(counts[None]), name="FusedRec/balance/summary").numpy()
        result["balance"] = plan.balance
        result["target_tokens_per_step"] = sequence_batches.target_tokens if plan.balance == "tokens" else None
        result["token_imbalance"] = balance_lib.token_imbalance(everyone[:, :, 1].T)
        result["samples_per_worker"] = balance_lib.samples_per_worker(everyone[:, :, 0].T)
        result["tokens_per_worker"] = everyone[:, :, 1].sum(axis=1).tolist()
        if self.meter is not None:  # each worker's time in the allreduces, waiting for the slowest included
            mine = tf.constant([result["allreduce_seconds_per_step"]], tf.float64)
            result["allreduce_seconds_per_step_per_worker"] = comm.allgather(
                mine, name="FusedRec/balance/allreduce_seconds").numpy().tolist()
        if self.timed_seconds:  # the samples the workers really held in the timed (last) steps, not batch_size x N
            timed = everyone[:, everyone.shape[1] - self.timed_steps:, :]
            result["samples_per_s"] = float(timed[:, :, 0].sum()) / self.timed_seconds
            result["tokens_per_s"] = float(timed[:, :, 1].sum()) / self.timed_seconds

    def _summarize_restored(self, result):
        """Adds where the run resumed: the step, the writing worker count, the bytes read, the checkpoint chain."""
        restored = self.restored
        result["restored"] = {"step": self.start, "from_workers": restored["workers"],
                              "bytes_read_per_rank": self.bytes_read,
                              "chain": [link["step"] for link in restored["chain"]]}

    def summary_path(self):
        """Where rank 0 writes the summary JSON: --summary-json, else DIR/summary.json with --model-dir, else None."""
        args = self.args
        if args.summary_json:
            return args.summary_json
        return os.path.join(args.model_dir, "summary.json") if args.model_dir else None

    def publish(self, result):
        """Rank 0: writes the AUC to TensorBoard and the summary JSON, then shows the short summary."""
        if self.rank == 0:
            if self.writer is not None:
                with self.writer.as_default(step=self.end_step):
                    if isinstance(result["auc"], dict):  # one AUC per task (a sequence config's click and conversion)
                        for task, value in result["auc"].items():
                            tf.summary.scalar(f"auc/{task}", value)
                    else:
                        tf.summary.scalar("auc", result["auc"])
                self.writer.close()
            path = self.summary_path()
            if path is not None:
                with open(path, "w") as f:
                    json.dump(result, f, indent=2)
            checkpoint = os.path.join(self.args.model_dir, f"ckpt-{self.end_step}") \
                if self.checkpointer is not None else None
            self.console.line("\n".join(summary_lines(result, checkpoint=checkpoint, summary_json=path)))


def run(args):
    """Trains as the flags and the config say; -> the summary (rank 0 also shows it short and writes its JSON)."""
    config = cfg.load_config(args.config)
    training = _TrainingRun(args, config, plan_of(args, config))
    training.start_workers()
    training.build_model()
    training.refuse_old_checkpoints()
    training.build_dense_weights()
    training.restore_checkpoint()
    training.connect_publisher()
    training.choose_hot_set()
    training.make_pipeline()
    training.train()
    result = training.summarize()
    training.publish(result)
    return result


def main(argv=None):
    try:
        run(parse_args(argv))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except tf.errors.OpError as e:  # bad data (the same error on every worker) or a failed collective
        bad = _bad_record(e.message)
        print(f"error: {bad or e.message}", file=sys.stderr)
        sys.exit(2 if bad else 1)


def _bad_record(message):
    """The reader's BadRecordError (naming the file, the record and what is wrong) in the message of the error tf.data
    raised for it (which wraps it in the function's name and the Python traceback), or None."""
    marker = "BadRecordError: "
    if marker not in message:
        return None
    return message.split(marker, 1)[1].split("\n", 1)[0].strip()
