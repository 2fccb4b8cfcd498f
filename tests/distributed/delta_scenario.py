"""Delta checkpoints, for tests/distributed/test_delta_checkpoints.py; runs alone or under horovodrun.

    python tests/distributed/delta_scenario.py --train LABEL=ROOT --steps 6 [--verify LABEL=ROOT ...]
        [--damaged LABEL=DIR ...] --out OUT

Each case of CASES (a table backend, row storage, sparse optimizer and eviction) trains scenario.py's model and
features (packed keys: the ids are recoverable, so any worker count restores) in one process, one case after the
other, each model in a variable scope of its own. Actions, in this order:

* --verify LABEL=ROOT: for each case, a fresh model restores ROOT/{case}/delta (full + delta checkpoints) and another
  ROOT/{case}/full (every checkpoint full); each writes its state under LABEL/{case}/{delta|full}/: per table t the
  sorted keys, rows and slot rows (zero where a slot row does not exist) and exists flags, with eviction each row's
  access status (count, last), the table's clock (a dense value: equal on every worker) and this rank's evicted
  counter (under counters{t}/, keyed by rank), every dense value (weights, optimizer slots and iterations, the step)
  and what restore() returned (JSON, "restored");
* --damaged LABEL=DIR: a model of the first case restores DIR (a delta model directory); LABEL/error is the
  CheckpointError's message ("" when it restored);
* --train LABEL=ROOT --steps S: for each case, a model restores ROOT/{case}/delta when it holds a checkpoint, trains
  to step S, and saves every SAVE_EVERY steps both into ROOT/{case}/delta (full_every=FULL_EVERY, keep=1) and into
  ROOT/{case}/full (full_every=0, keep=1); its state after training goes under LABEL/{case}/live/ and the
  checkpoints it wrote under LABEL/{case}/written (JSON); then ROOT is verified as with --verify.

Writes OUT/rank{r}.npz.
"""

import argparse
import importlib.util
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scenario as sc  # noqa: E402  (puts the repository root on sys.path)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_fusedrec as fr  # noqa: E402
from tf_fusedrec.distributed import comm as comm_lib  # noqa: E402
from tf_fusedrec.train.checkpoint import CheckpointError, Checkpointer, access_status_of  # noqa: E402

SAVE_EVERY = 2
FULL_EVERY = 10  # saves at 2, 4, 6, 8 give: 2 full (the first), 4, 6, 8 deltas
ALL_CASES = {
    "native": {"table_backend": "native", "storage": "float32", "optimizer": "adagrad", "evict": False},
    "native_fp16_evict": {"table_backend": "native", "storage": "float16", "optimizer": "adam", "evict": True},
    # Every checkpoint's table in part files of a couple of rows (Checkpointer(part_bytes)): the deltas' parts hold
    # the rows changed since the parent (found by digests) and every key's status. Adagrad: a step changes the rows it
    # reads only (Adam's moments decay on every row, so each of its deltas holds every row).
    "native_parts_evict": {"table_backend": "native", "storage": "float32", "optimizer": "adagrad", "evict": True,
                           "part_bytes": 200},
    "tfra_fp16_evict": {"table_backend": "tfra", "storage": "float16", "optimizer": "adam", "evict": True},
}
# What runs: without the [tfra] extra, its cases are left out (their tests, by name, carry the `tfra` marker).
CASES = {name: spec for name, spec in ALL_CASES.items()
         if spec["table_backend"] != "tfra" or importlib.util.find_spec("tensorflow_recommenders_addons") is not None}
EVICTION = fr.Eviction(capacity=6, policy="lru", interval=2)  # per worker and group: rows leave at every other step


class Run:
    """The workers' comm, and fresh model scopes."""

    def __init__(self):
        self.comm = comm_lib.init_workers()
        self.models = 0

    def build(self, case):
        """-> (model, optimizer, step variable) of a case, built (dense weights included) in a scope of its own."""
        spec = CASES[case]
        features = sc.make_features({"name": spec["optimizer"], "learning_rate": 0.1}, max_id_bits=20)
        self.models += 1
        with tf.compat.v1.variable_scope(f"model{self.models}"):
            layer = fr.FusedEmbedding(features, name="sparse", comm=self.comm, table_backend=spec["table_backend"],
                                      storage=spec["storage"], eviction=EVICTION if spec["evict"] else None)
            model = sc.Model(layer)
            model(self.batch(0), training=False)
        optimizer = fr.train.make_optimizer(model, default={"name": "adam", "learning_rate": 0.05})
        optimizer.create_slots(model.trainable_variables)  # before the first traced step: see scenario.create_variables
        return model, optimizer, tf.Variable(0, dtype=tf.int64, trainable=False)

    def batch(self, step):
        return sc.local_slice(sc.make_batch(step), self.comm.rank, self.comm.size)

    def checkpointer(self, model_dir, built, case, full_every=0):
        parts = {"part_bytes": CASES[case]["part_bytes"]} if "part_bytes" in CASES[case] else {}
        return Checkpointer(str(model_dir), *built, self.comm, keep=1, full_every=full_every, **parts)


def state(checkpointer, prefix):
    """{prefix/...: array} of this rank's tables and every dense value."""
    arrays = {}
    for t, table in enumerate(checkpointer.tables):
        keys, rows, slots = checkpointer.table_state(table)
        arrays[f"{prefix}/t{t}/keys"], arrays[f"{prefix}/t{t}/rows"] = keys, rows
        for (name, _), (values, exists) in zip(checkpointer._table_slots(table), slots):  # noqa: SLF001
            arrays[f"{prefix}/t{t}/slot/{name}"] = np.where(exists[:, None], values, 0)
            arrays[f"{prefix}/t{t}/exists/{name}"] = exists
        tracked = checkpointer.access[t]
        if tracked is not None:
            counts, lasts, clock = access_status_of(tracked, keys)
            arrays[f"{prefix}/t{t}/status/counts"], arrays[f"{prefix}/t{t}/status/lasts"] = counts, lasts
            arrays[f"{prefix}/dense/t{t}/clock"] = clock
            arrays[f"{prefix}/counters{t}/keys"] = np.array([checkpointer.comm.rank], np.int64)
            arrays[f"{prefix}/counters{t}/evicted"] = np.array([int(tracked.evicted.numpy())], np.int64)
    for key, v in checkpointer._dense_state():  # noqa: SLF001
        arrays[f"{prefix}/dense/{key}"] = v.numpy()
    return arrays


def verify(run, label, root):
    arrays = {}
    for case in CASES:
        for kind in ("delta", "full"):
            checkpointer = run.checkpointer(os.path.join(root, case, kind), run.build(case), case)
            restored = checkpointer.restore()
            arrays.update(state(checkpointer, f"{label}/{case}/{kind}"))
            arrays[f"{label}/{case}/{kind}/restored"] = np.array(json.dumps(restored))
    return arrays


def damaged(run, label, model_dir):
    try:
        case = next(iter(CASES))
        run.checkpointer(model_dir, run.build(case), case).restore()
    except CheckpointError as e:
        return {f"{label}/error": np.array(str(e))}
    return {f"{label}/error": np.array("")}


def train(run, label, root, steps):
    arrays = {}
    for case in CASES:
        model, optimizer, step = built = run.build(case)
        delta = run.checkpointer(os.path.join(root, case, "delta"), built, case, full_every=FULL_EVERY)
        full = run.checkpointer(os.path.join(root, case, "full"), built, case)
        restored = delta.restore()
        train_step = tf.function(sc.train_step_fn(model, optimizer), autograph=False)
        for s in range(int(step.numpy()), steps):
            train_step(run.batch(s))
            step.assign_add(1)
            if (s + 1) % SAVE_EVERY == 0:
                delta.save()
                full.save()
        arrays.update(state(delta, f"{label}/{case}/live"))
        arrays[f"{label}/{case}/written"] = np.array(json.dumps(
            {"delta": delta.written, "full": full.written, "restored": restored}))
    return arrays


def pair(text):
    label, _, path = text.partition("=")
    return label, path


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--train", type=pair)
    p.add_argument("--steps", type=int)
    p.add_argument("--verify", type=pair, action="append", default=[])
    p.add_argument("--damaged", type=pair, action="append", default=[])
    p.add_argument("--out", required=True)
    args = p.parse_args()

    run = Run()
    arrays = {}
    for label, root in args.verify:
        arrays.update(verify(run, label, root))
    for label, model_dir in args.damaged:
        arrays.update(damaged(run, label, model_dir))
    if args.train:
        arrays.update(train(run, *args.train, args.steps))
        arrays.update(verify(run, *args.train))
    sc.save_rank(args.out, run.comm.rank, arrays)


if __name__ == "__main__":
    main()
    sc.exit_now()  # (see there: the teardown costs seconds per process)
