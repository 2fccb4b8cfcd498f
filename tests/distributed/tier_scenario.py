"""Training on tiered tables (FusedEmbedding(tier=fr.Tiered(...))), for tests/distributed/test_tiered.py; runs alone
or under horovodrun.

    python tests/distributed/tier_scenario.py --run "--optimizer adam --tier 1 --out DIR" [--run ...]

Three features of one spec (one group, one table) with Zipf ids over 50,000, a global batch of 256 (each worker its
slice), a linear model, fr.train.make_optimizer with the group's optimizer and Adam on the dense weights, in a
tf.function. --tier 1 gives the table a DRAM cache of 1,536 rows (the table grows to several thousand), 0 keeps it all
in DRAM. With --model-dir, restores from it when it holds a checkpoint and saves every --save-every steps; --kill STEP
makes rank 1 SIGKILL itself right before training step STEP; --part-bytes writes the table's checkpoint in part
files of that size (Checkpointer(part_bytes=...)). Writes OUT/rank{r}.npz: the losses, this worker's table
(keys, rows and slots sorted by key), the dense weights, the tier statistics and what the restore read.
"""

import argparse
import json
import os
import shlex
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scenario as sc  # noqa: E402  (puts the repository root on sys.path)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_fusedrec as fr  # noqa: E402
from tf_fusedrec.distributed import comm as comm_lib  # noqa: E402
from tf_fusedrec.ops import native_table_ops  # noqa: E402
from tf_fusedrec.train.checkpoint import Checkpointer  # noqa: E402

GLOBAL_BATCH = 256
FEATURES = ("user", "item", "shop")
DIM = 8
CACHE_SLOTS = 2048  # 1,536 rows


def batch(step):
    rng = np.random.default_rng([11, step])
    out = {f: ((rng.zipf(1.15, GLOBAL_BATCH) * 7919) % 50_000).astype(np.int64) for f in FEATURES}
    out["label"] = rng.random(GLOBAL_BATCH).astype(np.float32)
    return out


def local(b, rank, size):
    per = GLOBAL_BATCH // size
    return {k: tf.constant(v[rank * per:(rank + 1) * per]) for k, v in b.items()}


class Model(tf.keras.Model):
    def __init__(self, embedding):
        super().__init__()
        self.embedding = embedding
        self.dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=3))

    def call(self, inputs, training=None):
        out = self.embedding({f: inputs[f] for f in FEATURES}, training=training)
        return self.dense(tf.concat([out[f] for f in FEATURES], axis=1))[:, 0]


def run_parser():
    p = argparse.ArgumentParser(prog="--run")
    p.add_argument("--optimizer", default="adagrad")
    p.add_argument("--tier", type=int, choices=[0, 1], default=1)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--model-dir")
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--kill", type=int)
    p.add_argument("--part-bytes", type=int, help="Checkpointer(part_bytes=...): the table in part files this size")
    p.add_argument("--full-every", type=int, default=0, help="Checkpointer(full_every=...): deltas between")
    p.add_argument("--name", help="the layer's name (default sparse<index>): a checkpoint's runs share one")
    p.add_argument("--out", required=True)
    return p


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--run", action="append", required=True, help="one run's flags (run_parser), repeatable")
    p.add_argument("--tier-root", required=True, help="the directory of the tiered tables' stores")
    args = p.parse_args()
    comm = comm_lib.init_workers()
    for index, text in enumerate(args.run):
        tf.keras.backend.clear_session()
        run = run_parser().parse_args(shlex.split(text))
        run_one(comm, run, run.name or f"sparse{index}", args.tier_root)


def run_one(comm, run, name, tier_root):
    rank, size = comm.rank, comm.size
    optimizer = {"name": run.optimizer, "learning_rate": 0.05}
    features = [fr.Feature(f, dim=DIM, optimizer=optimizer) for f in FEATURES]
    slots = len(native_table_ops.slot_names(run.optimizer))
    dram_bytes = CACHE_SLOTS * (8 + DIM * 4 + slots * DIM * 4 + 16) + CACHE_SLOTS // 4 + 64
    tier = fr.Tiered(dram_bytes, os.path.join(tier_root, name)) if run.tier else None
    model = Model(fr.FusedEmbedding(features, name=name, comm=comm, tier=tier))
    opt = fr.train.make_optimizer(model, default={"name": "adam", "learning_rate": 0.01})
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False)

    @tf.function(autograph=False)
    def train_step(inputs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(inputs, training=True) - inputs["label"]))
        variables = model.trainable_variables
        update = opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        with tf.control_dependencies([update]):
            step_var.assign_add(1)
            return tf.identity(loss)

    model.dense.build([None, DIM * len(FEATURES)])
    opt.create_slots(model.trainable_variables)
    restored = {}
    checkpointer = None
    if run.model_dir:
        parts = {} if run.part_bytes is None else {"part_bytes": run.part_bytes}
        checkpointer = Checkpointer(run.model_dir, model, opt, step_var, comm, keep=5, full_every=run.full_every,
                                    **parts)
        restored = checkpointer.restore() or {}
    losses = []
    for s in range(int(step_var.numpy()), run.steps):
        if run.kill is not None and rank == 1 and s + 1 == run.kill:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        losses.append(float(train_step(local(batch(s), rank, size)).numpy()))
        if checkpointer is not None and (s + 1) % run.save_every == 0:
            checkpointer.save()
    table = model.embedding.tables[0]
    keys, rows, table_slots = (x.numpy() for x in native_table_ops.native_table_export(table.resource))
    order = np.argsort(keys)
    stats = model.embedding.tier_statistics()[model.embedding.groups[0].name]
    os.makedirs(run.out, exist_ok=True)
    np.savez(os.path.join(run.out, f"rank{rank}.npz"), losses=np.array(losses), keys=keys[order], rows=rows[order],
             slots=table_slots[order], kernel=model.dense.kernel.numpy(), bias=model.dense.bias.numpy(),
             stats=json.dumps(stats), restored=json.dumps(restored))


if __name__ == "__main__":
    main()
    sc.exit_now()
