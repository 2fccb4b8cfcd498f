"""Training with hot-row replication, for tests/distributed/test_replication.py; runs alone or under horovodrun.

    python tests/distributed/hot_scenario.py --layer fused_packed --optimizer adam --hot 5 --steps 8 --out DIR
    python tests/distributed/hot_scenario.py --run="--hot 0 --out DIR1" --run="--hot 5 --repeek-at 4 --out DIR2"

The features, batches and model of scenario.py. --hot R replicates each group's R most counted pairs (counted over
the local slices of the first --sample-batches global batches, merged over workers; 0: no replication at all,
"auto": R by the cost model with the costs given by --costs). --repeek-at S re-chooses the hot sets before step S
from batches of another seed, moving rows and optimizer slots. Writes DIR/rank{r}.npz: losses, first-step outputs,
held-out predictions, dense weights, the sharded rows and slot rows it holds (table/..., slot/...) and, rank 0 only,
the replicated rows and slot rows (hot/..., hotslot/...; every rank checks that its copy equals rank 0's by writing
a digest), the replication reports (JSON) and per-feature statistics.

--run FLAGS (repeatable) trains several runs in one launch, one after another (the tests' way: the processes,
TensorFlow's import and Horovod's start are paid once): FLAGS are the single-run flags above, --out included, in one
shell-quoted string (give it as --run="FLAGS": the value starts with a dash). Each run gets a fresh Keras session and
its own layer name (sparse, sparse_1, ...: TFRA tables of the same name would share their rows), which shows in no
output (tables, hot sets and collectives are named after it; the saved keys and reports name features and groups).
"""

import argparse
import hashlib
import json
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scenario as sc  # noqa: E402  (puts the repository root on sys.path)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_fusedrec as fr  # noqa: E402
from tf_fusedrec.distributed import comm as comm_lib  # noqa: E402
from tf_fusedrec.distributed import replication  # noqa: E402

IDS = np.arange(12, dtype=np.int64)


def rows_of(params, layer, g, feature, slots=()):
    """{(what, feature, id): row} held in `params` (and its slots) for the feature's ids."""
    group = layer.groups[g]
    segments = np.full(len(IDS), group.feature_names.index(feature), np.int32)
    keys = fr.ops.category_unique(IDS, segments, group.num_categories, group.encoding).unified_keys
    out = {}
    for what, table in [("row", params)] + list(slots):
        values, exists = table.lookup(keys, return_exists=True)
        for i, v, e in zip(IDS, values.numpy(), exists.numpy()):
            if e:
                out[(what, feature, int(i))] = v
    return out


def add_run_flags(p):
    """The flags of one run (without --out)."""
    p.add_argument("--layer", choices=["fused", "fused_packed"], default="fused_packed")
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--hot", default="0", help="R, 0 or auto")
    p.add_argument("--costs", default="1e-6,1e-6", help="C_ar,C_a2a for --hot auto")
    p.add_argument("--sample-batches", type=int, default=4)
    p.add_argument("--repeek-at", type=int, default=None)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--table-backend", choices=["tfra", "native"], default="native")  # the layer's default


class _RunParser(argparse.ArgumentParser):
    """Parses one --run value; its errors become the --run flag's error."""

    def error(self, message):
        raise argparse.ArgumentTypeError(message)


def parse_run(text):
    """'--layer ... --out DIR' (a --run value) -> the run's flags (argparse.Namespace)."""
    p = _RunParser(prog="--run", add_help=False)
    add_run_flags(p)
    p.add_argument("--out", required=True)
    try:
        return p.parse_args(shlex.split(text))
    except (ValueError, argparse.ArgumentTypeError) as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None


def main():
    p = argparse.ArgumentParser()
    add_run_flags(p)
    p.add_argument("--out", help="the result directory of the one run the flags above describe")
    p.add_argument("--run", action="append", type=parse_run, default=[],
                   help="FLAGS: the flags of one run, --out included, in one string; repeatable; replaces the "
                        "flags above")
    args = p.parse_args()
    single = {k: v for k, v in vars(args).items() if k != "run"}
    if args.run and any(v != p.get_default(k) for k, v in single.items()):
        p.error("--run replaces the single-run flags: give them inside each --run")
    if not args.run and not args.out:
        p.error("give either --out (one run) or one or more --run")
    runs = args.run or [argparse.Namespace(**single)]

    comm = comm_lib.init_workers()
    for index, run in enumerate(runs):
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(run).items() if v is not None)
        print(f"[hot_scenario] rank {comm.rank}: run {index + 1}/{len(runs)}: {flags}", flush=True)
        tf.keras.backend.clear_session()
        run_one(comm, run, name="sparse" if index == 0 else f"sparse_{index}")


def run_one(comm, args, name):
    """Trains one run (args: its flags) with the layer named `name`; writes args.out/rank{r}.npz."""
    rank, size = comm.rank, comm.size
    optimizer = {"name": args.optimizer, "learning_rate": 0.1}
    features = sc.make_features(optimizer, max_id_bits=20 if args.layer == "fused_packed" else None)
    if args.hot == "auto":
        costs = tuple(float(c) for c in args.costs.split(","))
        hot = fr.HotReplication(rows=None, sample_batches=args.sample_batches, costs=costs)
    else:
        hot = fr.HotReplication(rows=int(args.hot), sample_batches=args.sample_batches) if int(args.hot) else None
    layer = fr.FusedEmbedding(features, name=name, comm=comm, replication=hot, table_backend=args.table_backend)
    model = sc.Model(layer)
    opt = fr.train.make_optimizer(model, default={"name": "sgd", "learning_rate": 0.1})
    reports = {}
    if hot is not None:
        sample = [{k: v for k, v in sc.local_slice(sc.make_batch(s), rank, size).items() if k != "label"}
                  for s in range(args.sample_batches)]
        reports["chosen"] = replication.choose_hot_set(layer, sample)
    sc.create_variables(model, opt, features)

    step = tf.function(sc.train_step_fn(model, opt), autograph=False)

    forward = tf.function(lambda inputs: model(inputs, training=True)[1], autograph=False)
    first = sc.local_slice(sc.make_batch(0), rank, size)
    outputs = {k: (v.to_tensor() if isinstance(v, tf.RaggedTensor) else v).numpy() for k, v in forward(first).items()}
    losses = []
    for s in range(args.steps):
        if hot is not None and args.repeek_at is not None and s == args.repeek_at:
            sample = [{k: v for k, v in sc.local_slice(sc.make_batch(s, seed=1), rank, size).items() if k != "label"}
                      for s in range(args.sample_batches)]
            reports["repeek"] = replication.repeek(layer, sample, opt)
        losses.append(float(step(sc.local_slice(sc.make_batch(s), rank, size)).numpy()))
    stats = {f"stat/{k}/{s}": int(v) for k, d in layer.statistics().items() for s, v in d.items()}
    predict = tf.function(lambda inputs: model(inputs, training=False)[0], autograph=False)
    eval_pred = predict(sc.local_slice(sc.make_batch(10_000), rank, size)).numpy()

    arrays = {}
    for g, group in enumerate(layer.groups):
        for table, kind in [(layer.tables[g], "table")] + ([(layer.hot_tables[g], "hot")] if hot else []):
            opt.create_slots([table.trainable])
            slots = [(f"slot-{n}", slot) for n, slot in opt.slot_tables(table.trainable)]
            for feature in group.feature_names:
                for (what, f, i), v in rows_of(table.params, layer, g, feature, slots).items():
                    arrays[f"{kind}/{what}/{f}/{i}"] = v
    hot_arrays = {k: v for k, v in arrays.items() if k.startswith("hot/")}
    digest = hashlib.sha256(b"".join(k.encode() + v.tobytes() for k, v in sorted(hot_arrays.items()))).hexdigest()
    if rank != 0:
        arrays = {k: v for k, v in arrays.items() if not k.startswith("hot/")}
    hot_sizes = [len(s) for s in layer.hot_sets]
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), losses=np.array(losses), eval_pred=eval_pred,
             kernel=model.dense.kernel.numpy(), bias=model.dense.bias.numpy(), hot_digest=digest,
             hot_sizes=np.array(hot_sizes, np.int64), reports=json.dumps(reports),
             **{f"out/{k}": v for k, v in outputs.items()}, **arrays, **stats)


if __name__ == "__main__":
    main()
    sc.exit_now()  # (see there: the teardown costs seconds per process)
