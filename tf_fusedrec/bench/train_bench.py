"""`python -m tf_fusedrec.bench`: the same model, data and steps with each embedding layer, side by side.

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python -m tf_fusedrec.bench \
        [--config configs/criteo_synthetic.yaml] [--steps 10] [--repeats 3] [--out bench_results]

Modes: fused (FusedEmbedding), per_feature (one TFRA HvdAllToAllEmbedding per feature, the baseline),
fused_nodedup and fused_source_hash (the ablations), tfra_hand_fused (TFRA's per-dim hand fusion), and fused_dbp /
fused_fwp (FusedEmbedding trained by fr.train.TrainPipeline with the dual-buffer and frozen-window schedules; k and
sample clustering from the config's train.micro_batches and train.cluster_samples), and fused_hot / fused_hot_dbp
(FusedEmbedding with hot-row replication, --hot auto|R, its hot rows counted on --hot-sample-batches batches that
follow the timed ones; sync and dual-buffer), fused_native / fused_tfra (fused with each table backend, whatever
the config's embedding.table_backend), fused_keras (the drop-in path: the layer's defaults, native tables, trained
by a plain Keras optimizer of the dense optimizer's class, `tf.keras.optimizers.Adam(...)` as a user writes it,
each table by its feature's optimizer, the gradients averaged over the workers in one grouped allreduce as
Horovod's DistributedGradientTape does in a user's loop; no fr.train.make_optimizer), fused_chain (fused with the op chains its fused
sender and output-sum ops replace: the same training, bit for bit, to measure those ops), and dense_only (the same model fed constant embeddings: no lookup and no
collective, each worker updating its own dense copy; the floor of a step, meant for 1 worker). Every mode is built in one
process and trains on the same pre-generated batches; after a warm-up the modes alternate, each repeat timing
`--steps` steps of every mode, so drift on the machine hits all modes alike. Reported per mode: samples/s over all
workers (median of repeats), all-to-all calls per step (forward + backward), mean bytes per all-to-all, seconds per
step spent in the forward all-to-alls (waiting for peers included), the time per step at least one all-to-all was
in flight and the part of it no dense compute hid (exposed), and each ratio to per_feature. A last pass of `--steps`
steps per mode splits the time in flight into waiting for the last worker to arrive and moving data
(AlltoallMeter.arrival_split: workers on one machine, whose clocks agree), for all-to-alls and allreduces. A sweep
then trains fused, per_feature and tfra_hand_fused on synthetic configs with M features for M in --sweep. Writes
OUT/bench.json, OUT/bench.png and prints the table docs/benchmarks/training.md shows.
"""

import argparse
import copy
import json
import os
import shlex
import sys
import time

import numpy as np
import tensorflow as tf

from tf_fusedrec import config as cfg
from tf_fusedrec.distributed import comm as comm_lib
from tf_fusedrec.layers.protocol import unconverted
from tf_fusedrec.train import experiment

MODES = ("fused", "per_feature", "fused_nodedup", "fused_source_hash", "tfra_hand_fused", "fused_dbp", "fused_fwp",
         "fused_hot", "fused_hot_dbp", "fused_native", "fused_tfra", "fused_chain", "dense_only", "fused_keras")
# fused with each table backend, whatever the config's embedding.table_backend says.
BACKENDS = {"fused_native": "native", "fused_tfra": "tfra"}
# What runs without --modes: fused (on the config's table backend, native by default) beside fused on TFRA tables;
# fused_native and dense_only (1 worker: the model's dense floor) on request.
DEFAULT_MODES = ("fused", "per_feature", "fused_nodedup", "fused_source_hash", "tfra_hand_fused", "fused_dbp",
                 "fused_fwp", "fused_hot", "fused_hot_dbp", "fused_tfra")
PIPELINED = {"fused_dbp": "dbp", "fused_fwp": "fwp", "fused_hot_dbp": "dbp"}
HOT = ("fused_hot", "fused_hot_dbp")
BASELINE = "per_feature"
# The modes on TFRA's tables or layers (the [tfra] extra, Keras 2): without it the default modes leave them out.
TFRA_MODES = ("per_feature", "tfra_hand_fused", "fused_tfra")


def tfra_missing():
    """None where TFRA can run in this process, else why not (the ImportError's message, which says what to do)."""
    from tf_fusedrec import _frameworks  # noqa: PLC0415

    try:
        _frameworks.tfra()
    except ImportError as e:
        return str(e)
    return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=experiment.DEFAULT_CONFIG)
    p.add_argument("--modes", help=f"comma-separated, of {', '.join(MODES)} (default: {','.join(DEFAULT_MODES)}, "
                                   f"without {', '.join(TFRA_MODES)} where TFRA is not installed)")
    p.add_argument("--batch-size", type=int, help="per worker (default: the config's)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per mode and repeat")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps-per-call", type=int, default=1, metavar="K",
                   help="steps one compiled call runs (TrainPipeline's steps_per_call), every mode")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batches", type=int, default=8, help="distinct pre-generated batches, cycled")
    p.add_argument("--hot", default="auto",
                   help="hot rows of the fused_hot modes: auto or R per group (0: no replication, built as fused)")
    p.add_argument("--hot-sample-batches", type=int, default=100, help="batches each worker counts for fused_hot")
    p.add_argument("--sweep", default="4,8,16,26,52", help="feature counts M for the second pass ('' to skip)")
    p.add_argument("--sweep-steps", type=int, default=5)
    p.add_argument("--out", default="bench_results")
    return p.parse_args(argv)


def build_embedding(mode, features, config, comm, replication=None):
    if mode == "tfra_hand_fused":
        from tf_fusedrec.bench.strawman import HandFusedTFRAEmbedding  # noqa: PLC0415

        return HandFusedTFRAEmbedding(features, optimizer=config.train.sparse_optimizer, comm=comm, name="sparse")
    if mode == "dense_only":
        return ConstantEmbedding(features, name="sparse")
    if mode == "fused_chain":
        return _with_op_chains(lambda: experiment.make_embedding("fused", features, config, comm=comm))
    if mode == "fused_keras":  # the layer's default tables, whatever the config says
        return experiment.make_embedding("fused", features, config, comm=comm, table_backend="native")
    if mode in HOT:  # on the config's table backend (native by default), as `fused`
        return experiment.make_embedding("fused", features, config, comm=comm, replication=replication)
    return experiment.make_embedding("fused" if mode in PIPELINED or mode in BACKENDS else mode, features, config,
                                     comm=comm, table_backend=BACKENDS.get(mode))


def _with_op_chains(build):
    """build(), its group lookups made with the op chains (ChainSender, per-feature segment sums) the fused ops
    replace."""
    from tf_fusedrec.distributed import group_lookup  # noqa: PLC0415

    saved = group_lookup.FUSED_SENDER, group_lookup.FUSED_OUTPUT
    group_lookup.FUSED_SENDER = group_lookup.FUSED_OUTPUT = False
    try:
        return build()
    finally:
        group_lookup.FUSED_SENDER, group_lookup.FUSED_OUTPUT = saved


class ConstantEmbedding(tf.keras.layers.Layer):
    """dense_only: the embedding layer's outputs as constants ([B, dim] per feature, 0.01 everywhere), nothing
    looked up or trained, no collective (the dense optimizer is a plain Keras one, so workers do not average): the
    model's dense part alone, the floor a 1-worker fused step is compared with."""

    def __init__(self, features, name=None):
        super().__init__(name=name)
        self.features = list(features)

    @unconverted
    def call(self, inputs, training=None):  # noqa: ARG002
        rows = {}
        for f in self.features:
            ids = inputs[f.name]
            batch = ids.nrows() if isinstance(ids, tf.RaggedTensor) else tf.shape(ids)[0]
            rows[f.name] = tf.fill(tf.stack([batch, f.dim]), tf.constant(0.01, tf.float32))
        return rows


def keras_optimizer(spec):
    """`tf.keras.optimizers.<Class>(**hyperparameters)` of an optimizer spec: what a user's own code builds (tf_keras'
    new optimizers under Keras 2, not the legacy ones fr.train.make_optimizer uses there)."""
    from tf_fusedrec import _keras  # noqa: PLC0415

    spec = cfg.optimizer_spec(spec, "train.dense_optimizer")
    return getattr(tf.keras.optimizers, _keras.OPTIMIZER_CLASSES[spec.name])(**dict(spec.config))


class AveragedKerasOptimizer:
    """fused_keras' optimizer: a plain Keras optimizer whose gradients are first averaged over the workers in one
    grouped allreduce, which is what horovod.tensorflow.DistributedGradientTape does in a user's training loop (the
    native tables' row gradients are not among them: each table keeps its own, summed by the all-to-all)."""

    def __init__(self, optimizer, comm):
        self.optimizer, self.comm = optimizer, comm

    def apply_gradients(self, grads_and_vars):
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if self.comm.size > 1:
            grads = self.comm.allreduce([tf.convert_to_tensor(g) for g, _ in pairs], name="fused_keras/gradients",
                                        op="average")
            pairs = [(g, v) for g, (_, v) in zip(grads, pairs)]
        return self.optimizer.apply_gradients(pairs)


def replication_of(args):
    from tf_fusedrec.distributed.replication import HotReplication  # noqa: PLC0415

    return HotReplication(rows=None if args.hot == "auto" else int(args.hot), sample_batches=args.hot_sample_batches)


class Runner:
    """One mode: its own tables (in a variable scope named after the config and the mode), model, optimizer and
    TrainPipeline, on the shared batches, cycled."""

    def __init__(self, mode, config, batches, comm, meter, hot_sample=None, replication=None, steps_per_call=1):
        import tf_fusedrec as fr  # noqa: PLC0415

        self.mode = mode
        with tf.compat.v1.variable_scope(f"{config.name}/{mode}"):
            embedding = build_embedding(mode, config.embedding_features(), config, comm, replication)
        self.hot = None
        if mode in HOT and embedding.replication is not None:
            from tf_fusedrec.distributed import replication as replication_lib  # noqa: PLC0415

            self.hot = replication_lib.choose_hot_set(embedding, hot_sample)
        self.model = experiment.make_model(config, embedding)
        # Built on a first batch (as the train CLI does): TrainPipeline then creates the optimizers' variables before
        # the first step, which is traced once (a first call that creates variables is traced twice).
        self.model(next(iter(batches.take(1)))[0], training=False)
        if mode == "dense_only":
            self.optimizer = cfg.optimizer_spec(config.train.dense_optimizer, "train.dense_optimizer").build()
        elif mode == "fused_keras":
            self.optimizer = AveragedKerasOptimizer(keras_optimizer(config.train.dense_optimizer), comm)
        else:
            self.optimizer = fr.train.make_optimizer(self.model, default=config.train.dense_optimizer)
        schedule = PIPELINED.get(mode, "sync")
        fwp = schedule == "fwp"
        self.pipeline = fr.train.TrainPipeline(
            self.model, self.optimizer, experiment.binary_cross_entropy(), batches.repeat(), schedule=schedule,
            micro_batches=config.train.micro_batches if fwp else 1,
            cluster_samples=config.train.cluster_samples if fwp else False, meter=meter,
            steps_per_call=steps_per_call)

    def run(self, steps):
        """`steps` steps; with steps_per_call K > 1 in calls of K (the last one shorter)."""
        loss = None
        if self.pipeline.steps_per_call == 1:
            for _ in range(steps):
                loss = self.pipeline.progress()
            return float(loss)
        done = 0
        while done < steps:
            losses = self.pipeline.progress_many(steps - done)
            done += int(losses.shape[0])
            loss = losses[-1]
        return float(loss)

    def alltoall_ops(self):
        return experiment.count_alltoall_ops(self.pipeline.concrete_step())


# Every Runner built stays referenced until the process ends (python -m tf_fusedrec.bench leaves by os._exit, without
# collecting them). A Runner dropped after its measure() is freed by a later cyclic garbage collection, at whatever
# point of a later measurement that falls: freeing one (its model, tables and prefetching tf.data iterator, whose
# destructor waits for its threads) took 0.3-10.7 s (benchmarks/results/tests/teardown.txt), and a 15 s pause in the sweep's
# warm-up appeared once the import order shifted when the collections ran (benchmarks/results/tests/bench_gc.txt).
_RUNNERS = []


def measure(config, modes, args, comm, meter, log):
    batch_size = args.batch_size or config.train.batch_size
    batches = experiment.make_dataset(config, batch_size, comm.rank, comm.size).take(args.batches).cache()
    layer_comm = meter.wrap(comm) if meter is not None else comm
    hot_sample = None
    if any(m in HOT for m in modes):  # counted on the batches after the timed ones
        hot_sample = experiment.embedding_sample(config, batch_size, comm.rank, comm.size, args.batches,
                                                 args.hot_sample_batches)
    runners = {}
    _RUNNERS.append(runners)
    for mode in modes:
        log(f"  building {mode}")
        runners[mode] = Runner(mode, config, batches, layer_comm, meter, hot_sample, replication_of(args),
                               args.steps_per_call)
        if runners[mode].hot is not None:
            log("    hot rows: " + ", ".join(f"{r['group']} R={r['rows']} rho={r['rho']:.3f}"
                                          for r in runners[mode].hot))
        elif mode in HOT:  # replication=0 is no replication (replication.parse_replication), not an empty hot set
            log(f"    hot rows: none: --hot 0 replicates nothing, so {mode} is built without a hot layer (as "
                f"{mode.replace('_hot', '')}); --hot auto measures the hot layer with the rows the model chooses")
        runners[mode].run(args.warmup)
    samples = {m: [] for m in modes}
    traffic = {m: [] for m in modes}
    cpu = {m: [] for m in modes}  # this worker's CPU seconds per step, all its threads
    for r in range(args.repeats):
        for mode in modes:
            if meter is not None:
                meter.reset()
            t0, cpu0 = time.perf_counter(), time.process_time()
            runners[mode].run(args.steps)
            elapsed = time.perf_counter() - t0
            cpu[mode].append((time.process_time() - cpu0) / args.steps)
            samples[mode].append(batch_size * comm.size * args.steps / elapsed)
            if meter is not None:
                traffic[mode].append(meter.per_step(args.steps))
        log(f"  repeat {r + 1}/{args.repeats}: " + ", ".join(f"{m} {samples[m][-1]:,.0f}" for m in modes))
    split = {m: arrival_pass(runners[m], meter, comm, args.steps) for m in modes} if meter is not None else {}
    results = {}
    for mode in modes:
        entry = {"samples_per_s": float(np.median(samples[mode])), "samples_per_s_repeats": samples[mode],
                 "step_seconds": batch_size * comm.size / float(np.median(samples[mode])),
                 "cpu_seconds_per_step": float(np.median(cpu[mode])),
                 "alltoall_ops_in_step_graph": runners[mode].alltoall_ops()}
        if runners[mode].hot is not None:
            entry["hot"] = runners[mode].hot
        if traffic[mode]:
            for key in traffic[mode][0]:
                entry[key] = float(np.median([t[key] for t in traffic[mode]]))
        entry.update(split.get(mode, {}))
        results[mode] = entry
    return results


def arrival_pass(runner, meter, comm, steps):
    """After the timed repeats: `steps` more steps of one mode, each followed by the meter's arrival_split (an
    allgather, so the workers start each step together), giving per step the time all-to-alls and allreduces spent
    waiting for the last worker to arrive and the time they moved data, medians over the steps."""
    splits = []
    for _ in range(steps):
        since = time.time()
        runner.run(1)
        splits.append(meter.arrival_split(comm, since))
    entry = {}
    for kind in ("alltoall", "allreduce"):
        for part in ("wait", "transfer"):
            values = [s[kind][part] for s in splits if kind in s]
            if values:
                entry[f"{kind}_{part}_seconds_per_step"] = float(np.median(values))
    return entry


def sweep_config(base, num_features):
    """base with M = num_features features: half of dim 16, half of dim 8, the first feature's data settings."""
    config = copy.deepcopy(base)
    template = base.features[0]
    config.features = [
        cfg.FeatureConfig(name=f"F{i + 1}", dim=16 if i < num_features // 2 else 8, vocab=template.vocab,
                          zipf=template.zipf, hotness=1, optimizer=template.optimizer,
                          max_id_bits=template.max_id_bits)
        for i in range(num_features)
    ]
    config.name = f"{base.name}_M{num_features}"
    return config


def main(argv=None):
    args = parse_args(argv)
    comm = comm_lib.init_workers()
    comm_lib.overlap_collectives()  # collectives and the meter's stamps run when their inputs allow, not in order
    rank, size = comm.rank, comm.size
    try:
        config = cfg.load_config(args.config)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    modes = list(DEFAULT_MODES) if args.modes is None else [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        print(f"error: unknown mode {unknown[0]!r}; modes are {MODES}", file=sys.stderr)
        sys.exit(2)
    needs_tfra = [m for m in modes if m in TFRA_MODES]
    why = tfra_missing() if needs_tfra else None
    if why and args.modes is not None:
        print(f"error: --modes {','.join(needs_tfra)} run on TFRA: {why}", file=sys.stderr)
        sys.exit(2)
    if why:
        modes = [m for m in modes if m not in TFRA_MODES]
        if rank == 0:
            print(f"bench: TFRA is not usable here, so the default modes leave out {', '.join(needs_tfra)} (ratios "
                  f"against fused only): {why}", file=sys.stderr, flush=True)
    if not all(m.isdigit() and int(m) > 0 for m in args.sweep.split(",") if m):
        print(f"error: --sweep must be feature counts like 4,8,16 (or empty to skip), got {args.sweep!r}",
              file=sys.stderr)
        sys.exit(2)
    if args.hot != "auto" and not (args.hot.isdigit()):
        print(f"error: --hot must be auto or a number of rows >= 0, got {args.hot!r}", file=sys.stderr)
        sys.exit(2)
    if args.steps_per_call < 1:
        print(f"error: --steps-per-call must be >= 1, got {args.steps_per_call}", file=sys.stderr)
        sys.exit(2)
    from tf_fusedrec.distributed.meter import AlltoallMeter  # noqa: PLC0415

    meter = AlltoallMeter() if size > 1 else None

    def log(msg):
        if rank == 0:
            print(msg, file=sys.stderr, flush=True)

    log(f"bench: {config.name}, {size} workers, batch {args.batch_size or config.train.batch_size} per worker, "
        f"modes {modes}")
    results = measure(config, modes, args, comm, meter, log)
    sweep = {}
    counts = [int(m) for m in args.sweep.split(",") if m]
    sweep_modes = [m for m in ("fused", "per_feature", "tfra_hand_fused") if m in modes]
    sweep_args = argparse.Namespace(**{**vars(args), "steps": args.sweep_steps, "repeats": 2})
    for m in counts:
        log(f"sweep: M = {m} features")
        sweep[m] = measure(sweep_config(config, m), sweep_modes, sweep_args, comm, meter, log)
    if rank == 0:
        network, hosts = network_of(size)
        report = {"config": config.name, "workers": size, "hosts": hosts, "network": network,
                  "cpus_per_worker": len(os.sched_getaffinity(0)),  # rank 0's; taskset or --cores-per-worker
                  "batch_size_per_worker": args.batch_size or config.train.batch_size, "steps": args.steps,
                  "steps_per_call": args.steps_per_call, "repeats": args.repeats, "modes": results,
                  "sweep": {str(k): v for k, v in sweep.items()},
                  "command": f"{launcher(size)}.venv/bin/python -m tf_fusedrec.bench {shlex.join(sys.argv[1:])}"}
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench.json"), "w") as f:
            json.dump(report, f, indent=2)
        print(table(report))
        chart(report, os.path.join(args.out, "bench.png"))
        log(f"wrote {args.out}/bench.json and {args.out}/bench.png")


def network_of(size):
    """(network, hosts): under tf_fusedrec.cluster the workers are on namespaced hosts with shaped links; else on
    loopback (or none, one worker)."""
    network = os.environ.get("FUSEDREC_CLUSTER_LINK_RATE", "loopback" if size > 1 else "none")
    return network, int(os.environ.get("HOROVOD_CROSS_SIZE", 1))


def launcher(size):
    """The command prefix that started these workers: the namespaced cluster, horovodrun, or none."""
    network, hosts = network_of(size)
    if size == 1:
        return ""
    if network == "loopback":
        return f"horovodrun -np {size} -H localhost:{size} --gloo "
    return f"python -m tf_fusedrec.cluster --hosts {hosts} --link-rate {network} --workers-per-host {size // hosts} -- "


def table(report):
    modes = report["modes"]
    base = modes.get(BASELINE, {}).get("samples_per_s")
    fused = modes.get("fused", {}).get("samples_per_s")
    lines = ["| mode | samples/s (all workers) | vs per_feature | vs fused | all-to-alls / step | mean bytes / all-to-all "
             "| forward all-to-all s / step | all-to-all in flight s / step | exposed all-to-all s / step "
             "| all-to-all waiting for peers s / step | all-to-all moving s / step "
             "| step s | CPU s / step (rank 0) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, r in modes.items():
        ratio = f"{r['samples_per_s'] / base:.2f}x" if base else "-"
        vs_fused = f"{r['samples_per_s'] / fused:.2f}x" if fused else "-"
        calls = r.get("alltoall_calls_per_step", r["alltoall_ops_in_step_graph"])
        lines.append(f"| {mode} | {r['samples_per_s']:,.0f} | {ratio} | {vs_fused} | {calls:.0f} | "
                     f"{r.get('alltoall_mean_message_bytes', 0):,.0f} | "
                     f"{r.get('forward_alltoall_seconds_per_step', 0):.4f} | "
                     f"{r.get('alltoall_busy_seconds_per_step', 0):.4f} | "
                     f"{r.get('exposed_alltoall_seconds_per_step', 0):.4f} | "
                     f"{r.get('alltoall_wait_seconds_per_step', 0):.4f} | "
                     f"{r.get('alltoall_transfer_seconds_per_step', 0):.4f} | {r.get('step_seconds', 0):.4f} | "
                     f"{r.get('cpu_seconds_per_step', 0):.4f} |")
    if report["sweep"]:
        sweep_modes = list(next(iter(report["sweep"].values())))
        lines += ["", "| features M | " + " | ".join(f"{m} samples/s" for m in sweep_modes) + " | fused vs per_feature |",
                  "|---:|" + "---:|" * (len(sweep_modes) + 1)]
        for m, r in report["sweep"].items():
            ratio = (f"{r['fused']['samples_per_s'] / r['per_feature']['samples_per_s']:.2f}x"
                     if "fused" in r and "per_feature" in r else "-")
            lines.append(f"| {m} | " + " | ".join(f"{r[x]['samples_per_s']:,.0f}" for x in sweep_modes) +
                         f" | {ratio} |")
    return "\n".join(lines)


def chart(report, path):
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    panels = 2 + bool(report["sweep"])
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.8))
    axes = np.atleast_1d(axes)
    modes = report["modes"]
    axes[0].bar(list(modes), [r["samples_per_s"] for r in modes.values()], color="tab:blue")
    axes[0].set_ylabel("samples/s (all workers)")
    axes[0].set_title(f"{report['config']}, {report['workers']} workers, {report.get('network', 'loopback')}")
    axes[0].tick_params(axis="x", rotation=30)
    # Step time = compute + exposed all-to-all; hidden all-to-all (in flight while compute ran) drawn beside.
    names = list(modes)
    step_ms = np.array([modes[m]["step_seconds"] * 1e3 for m in names])
    exposed = np.array([modes[m].get("exposed_alltoall_seconds_per_step", 0.0) * 1e3 for m in names])
    hidden = np.array([(modes[m].get("alltoall_busy_seconds_per_step", 0.0)
                        - modes[m].get("exposed_alltoall_seconds_per_step", 0.0)) * 1e3 for m in names])
    x = np.arange(len(names))
    axes[1].bar(x - 0.2, step_ms - exposed, 0.4, label="compute (step - exposed)", color="tab:green")
    axes[1].bar(x - 0.2, exposed, 0.4, bottom=step_ms - exposed, label="exposed all-to-all", color="tab:red")
    axes[1].bar(x + 0.2, hidden, 0.4, label="hidden all-to-all (overlapped)", color="tab:orange")
    axes[1].set_xticks(x, names, rotation=30)
    axes[1].set_ylabel("ms per step")
    axes[1].set_title("step time split")
    axes[1].legend(fontsize=8)
    if report["sweep"]:
        counts = sorted(report["sweep"], key=int)
        for mode in next(iter(report["sweep"].values())):
            axes[2].plot([int(c) for c in counts], [report["sweep"][c][mode]["samples_per_s"] for c in counts],
                         marker="o", label=mode)
        axes[2].set_xlabel("number of sparse features M")
        axes[2].set_ylabel("samples/s (all workers)")
        axes[2].set_title("samples/s against M")
        axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
