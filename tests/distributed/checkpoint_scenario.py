"""Training with checkpoints, for tests/distributed/test_checkpoints.py; runs alone or under horovodrun.

    python tests/distributed/checkpoint_scenario.py --model-dir DIR --steps 6 --save-every 3 --out OUT

The model, features and data of scenario.py (packed groups, so ids are recoverable from the keys), with a global
batch of 12 (every worker count in 1..4 takes an equal slice) and Adam on the dense weights (optimizer slots and
iterations on both sides). Restores from --model-dir when it holds a checkpoint, trains up to --steps, saves every
--save-every steps, and writes OUT/rank{r}.npz: tables keyed by (feature, id), the dense weights, and what the
restore read. A CheckpointError prints "error: ..." and exits 2.

--kill RANK:STEP:POINT makes rank RANK SIGKILL itself (the crash tests): POINT "step" right before training step
STEP (its peers are then inside that step's collectives), "mid-save" halfway through writing its shard of the
step-STEP checkpoint, "before-save" before writing it (its peer has written its own: a kill between the two ranks'
saves).
"""

import argparse
import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scenario as sc  # noqa: E402  (puts the repository root on sys.path)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_fusedrec as fr  # noqa: E402
from tf_fusedrec.distributed import comm as comm_lib  # noqa: E402
from tf_fusedrec.train import checkpoint as checkpoint_lib  # noqa: E402
from tf_fusedrec.train.checkpoint import CheckpointError, Checkpointer  # noqa: E402

sc.GLOBAL_BATCH = 12


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layer", choices=["fused_packed", "per_feature"], default="fused_packed")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-every", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--kill", help="RANK:STEP:POINT, POINT one of step, mid-save, before-save")
    p.add_argument("--part-bytes", type=int, default=checkpoint_lib.PART_BYTES,
                   help="Checkpointer(part_bytes=...): small, the tables go to part files of a few rows")
    args = p.parse_args()

    comm = comm_lib.init_workers()
    rank, size = comm.rank, comm.size
    kill_step, kill_point = None, None
    if args.kill:
        kill_rank, kill_step, kill_point = args.kill.split(":")
        kill_step = int(kill_step) if int(kill_rank) == rank else None
        if kill_step is not None and kill_point != "step":
            arm_save_kill(kill_step, kill_point)
    features = sc.make_features({"name": "adagrad", "learning_rate": 0.1}, max_id_bits=20)
    layer_cls = fr.PerFeatureEmbedding if args.layer == "per_feature" else fr.FusedEmbedding
    model = sc.Model(layer_cls(features, name="sparse", comm=comm))
    opt = fr.train.make_optimizer(model, default={"name": "adam", "learning_rate": 0.05})
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False)

    @tf.function(autograph=False)
    def train_step(inputs):
        with tf.GradientTape() as tape:
            pred, _ = model(inputs, training=True)
            loss = tf.reduce_mean(tf.square(pred - inputs["label"]))
        variables = model.trainable_variables
        update = opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        with tf.control_dependencies([update]):
            return step_var.assign_add(1)

    model(sc.local_slice(sc.make_batch(0), rank, size), training=False)
    opt.create_slots(model.trainable_variables)  # before train_step's first call: see scenario.create_variables
    checkpointer = Checkpointer(args.model_dir, model, opt, step_var, comm, keep=5, part_bytes=args.part_bytes)
    try:
        restored = checkpointer.restore() or {}
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    for s in range(int(step_var.numpy()), args.steps):
        if kill_point == "step" and s + 1 == kill_step:
            die()
        train_step(sc.local_slice(sc.make_batch(s), rank, size))
        if (s + 1) % args.save_every == 0:
            checkpointer.save()

    tables = {}
    ids = np.arange(12, dtype=np.int64)
    for f in features:
        for i, r in zip(ids, sc.table_rows(model.embedding, f.name, ids)):
            if r is not None:
                tables[f"table/{f.name}/{i}"] = r
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), kernel=model.dense.kernel.numpy(),
             bias=model.dense.bias.numpy(), restored=json.dumps(restored), **tables)


def die():
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def arm_save_kill(step, point):
    """Dies while this rank writes (mid-save) or before it writes (before-save) its shard of checkpoint `step`."""
    write = checkpoint_lib._write_atomic  # noqa: SLF001

    def dying_write(path, data):
        if os.path.basename(os.path.dirname(path)) == f".tmp-ckpt-{step}" and "shard-" in os.path.basename(path):
            if point == "mid-save":
                with open(path + ".part", "wb") as f:
                    f.write(data[:len(data) // 2])
            die()
        write(path, data)

    checkpoint_lib._write_atomic = dying_write  # noqa: SLF001


if __name__ == "__main__":
    main()
    sc.exit_now()  # (see there: the teardown costs seconds per process)
