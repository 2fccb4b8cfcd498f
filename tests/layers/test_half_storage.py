"""float16 table storage (FusedEmbedding(storage="float16"), tf_fusedrec/distributed/table.py) on one worker.

* HalfRows, the union of the float16 store and the rows in flight: values float16 can hold round-trip exactly,
  others become the nearest float16; in-flight rows win; remove and export see both;
* SGD training against an independent NumPy reference (Hashed initial rows, float32 update, one rounding to float16
  per update), eager and tf.function: every step's outputs and every row after training, bit for bit;
* Adagrad and Adam against float32 storage whose rows the test rounds to float16 after each update: outputs, rows and
  optimizer slots equal; nothing stays in flight between steps;
* with hot-row replication the replicated rows stay float32 (mixed precision); a hot-set move rounds the rows that
  leave it; a checkpoint of the mix restores and continues exactly;
* row bytes: float16 rows cost 8 + 2 dim bytes per key instead of 8 + 4 dim;
* a storage that is not float32 or float16 is a ValueError naming it.
The 2-worker run is tests/distributed/test_horovod.py::test_float16_storage_two_workers_equal_one_worker.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec import initializers
from tf_fusedrec.distributed import replication as rl
from tf_fusedrec.distributed.comm import SingleProcessComm
from tf_fusedrec.distributed.table import EmbeddingTable
from tf_fusedrec.train.checkpoint import Checkpointer

from tests.layers.test_hot_replication import Trainer, batch  # the linear model over a FusedEmbedding, its batches

VOCAB = 12


def round16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


# --- HalfRows -----------------------------------------------------------------------------------------------------

@pytest.mark.tfra
def test_half_rows_round_trip_and_in_flight_rows():
    table = EmbeddingTable("half_rows", 3, initializers.Hashed(0, 0.05), [11], storage="float16")
    keys = tf.constant([5, 9, 2], tf.int64)
    exact = np.array([[0.5, -1.25, 1024.0], [0.0, 2 ** -14, -3.0], [65504.0, 1.0, -0.125]], np.float32)
    table.rows.upsert(keys, exact)
    k, v = (x.numpy() for x in table.rows.export())
    got = dict(zip(k.tolist(), v))
    assert sorted(got) == [2, 5, 9]
    for key, want in zip([5, 9, 2], exact):
        np.testing.assert_array_equal(got[key], want, err_msg=f"key {key}")
    values, exists = table.rows.lookup(tf.constant([9, 7], tf.int64), return_exists=True)
    np.testing.assert_array_equal(values.numpy()[0], exact[1])
    assert exists.numpy().tolist() == [True, False]
    inexact = np.array([[0.1, 1 / 3, 1e-6]], np.float32)
    table.rows.upsert(tf.constant([7], tf.int64), inexact)
    np.testing.assert_array_equal(table.rows.lookup(tf.constant([7], tf.int64)).numpy(), round16(inexact))
    # A row in flight (staged by a training lookup, then changed in params) wins over the stored one.
    table.lookup(tf.constant([5], tf.int64), None, None, training=True)
    table.params.upsert(tf.constant([5], tf.int64), tf.constant([[0.1, 0.2, 0.3]]))
    np.testing.assert_allclose(table.rows.lookup(tf.constant([5], tf.int64)).numpy(), [[0.1, 0.2, 0.3]])
    k, v = (x.numpy() for x in table.rows.export())
    assert sorted(k.tolist()) == [2, 5, 7, 9], "a key exported twice or lost"
    np.testing.assert_allclose(v[k.tolist().index(5)], [0.1, 0.2, 0.3])
    # commit() rounds the row in flight into the store and empties params.
    table.commit()
    assert int(table.params.size()) == 0 and int(table.store.size()) == 4 and int(table.size()) == 4
    np.testing.assert_array_equal(table.rows.lookup(tf.constant([5], tf.int64)).numpy(), round16([[0.1, 0.2, 0.3]]))
    table.rows.remove(tf.constant([5, 2], tf.int64))
    assert sorted(table.rows.export()[0].numpy().tolist()) == [7, 9]
    # training=False: no insert, the Hashed row of an id never stored.
    missing = table.lookup(tf.constant([100], tf.int64), None, None, training=False).numpy()
    want = initializers.hashed_rows_numpy([100], [11], 3, 0.05)
    np.testing.assert_array_equal(missing, want)
    assert int(table.size()) == 2


def test_storage_must_be_float32_or_float16():
    with pytest.raises(ValueError, match="storage must be one of .*'bfloat16'"):
        fr.FusedEmbedding([fr.Feature("a", dim=4)], storage="bfloat16", name="bad_storage")


def test_row_bytes_halve_the_values():
    layer = fr.FusedEmbedding([fr.Feature("a", dim=16)], storage="float16", name="bytes16")
    plain = fr.FusedEmbedding([fr.Feature("a", dim=16)], name="bytes32")
    ids = {"a": tf.constant(np.arange(10), tf.int64)}
    for lay in (layer, plain):
        opt = fr.train.make_optimizer(lay, default="sgd")
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(lay(ids, training=True)["a"])
        opt.apply_gradients(zip(tape.gradient(loss, lay.trainable_variables), lay.trainable_variables))
    assert layer.table_bytes() == {"rows": 10 * (8 + 2 * 16), "storage": "float16"}
    assert plain.table_bytes() == {"rows": 10 * (8 + 4 * 16), "storage": "float32"}


# --- SGD against NumPy --------------------------------------------------------------------------------------------

def train_sgd_against_numpy(mode, stored_initial, stored_update, after_step=None, **layer_kwargs):
    """Trains a float16-storage FusedEmbedding (features a and b, dim 4, SGD lr 0.5; `layer_kwargs` add to it) for 6
    steps of loss = sum_f sum_b <out_f[b], W_f[b]>, eagerly or in a tf.function, against a NumPy model of its rows:
    the gradient of row (f, id) is the sum of W_f[b] over the b holding id, and W is a multiple of 1/8, so the float32
    sums are exact and the one rounding to float16 is the reference's. Every step's outputs and, at the end, every row
    must equal the model's bit for bit.

    stored_initial(row) -> what the model holds for a float32 initial (Hashed) row before its first update;
    stored_update(layer, feature, id, step, w) -> the stored row after the float32 update w (step: 0-based);
    after_step(layer): checks after each step. -> the layer."""
    dim, lr, seed = 4, 0.5, 0
    feats = [fr.Feature("a", dim=dim, max_id_bits=8), fr.Feature("b", dim=dim, max_id_bits=8)]
    layer = fr.FusedEmbedding(feats, optimizer={"name": "sgd", "learning_rate": lr}, storage="float16",
                              **layer_kwargs)
    opt = fr.train.make_optimizer(layer, default="sgd")

    def step(inputs, weights):
        with tf.GradientTape() as tape:
            out = layer(inputs, training=True)
            loss = tf.add_n([tf.reduce_sum(out[f] * weights[f]) for f in ("a", "b")])
        variables = layer.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return out

    step = tf.function(step) if mode == "function" else step
    salts = {f: initializers.feature_salt(seed, f) for f in ("a", "b")}
    ref = {}

    def row(f, i):
        if (f, i) not in ref:
            ref[(f, i)] = stored_initial(initializers.hashed_rows_numpy([i], [salts[f]], dim, 0.05)[0])
        return ref[(f, i)]

    rng = np.random.default_rng(1)
    for s in range(6):
        ids = {f: rng.integers(0, VOCAB, 10).astype(np.int64) for f in ("a", "b")}
        weights = {f: (rng.integers(-16, 17, (10, dim)) / 8.0).astype(np.float32) for f in ("a", "b")}
        out = step({f: tf.constant(v) for f, v in ids.items()}, {f: tf.constant(v) for f, v in weights.items()})
        for f in ("a", "b"):
            want = np.stack([row(f, int(i)) for i in ids[f]])
            np.testing.assert_array_equal(out[f].numpy(), want, err_msg=f"step {s} output {f}")
        for f in ("a", "b"):
            for i in np.unique(ids[f]):
                w = row(f, int(i)) - np.float32(lr) * weights[f][ids[f] == i].sum(axis=0)
                ref[(f, int(i))] = stored_update(layer, f, int(i), s, w)
        if after_step is not None:
            after_step(layer)
    all_ids = {f: tf.constant(np.arange(VOCAB), tf.int64) for f in ("a", "b")}
    got = layer(all_ids, training=False)
    for f in ("a", "b"):
        np.testing.assert_array_equal(got[f].numpy(), np.stack([row(f, i) for i in range(VOCAB)]),
                                      err_msg=f"rows of {f} after training")
    return layer


@pytest.mark.tfra
@pytest.mark.parametrize("mode", ["function", "eager"])
def test_sgd_equals_numpy_reference(mode):
    """train_sgd_against_numpy with round to nearest: a TFRA row stays float32 until its first update (the native
    table rounds it when inserting it: test_native_float16_storage_trains_like_tfra_float16 says how they agree)."""
    def no_rows_in_flight(layer):
        assert int(layer.tables[0].params.size()) == 0, "rows left in flight after the update"

    train_sgd_against_numpy(mode, lambda initial: initial, lambda layer, f, i, s, w: round16(w),
                            after_step=no_rows_in_flight, name="sgd16", table_backend="tfra")


# --- Adagrad / Adam against float32 storage rounded by hand -------------------------------------------------------

def round_rows(trainer):
    """float32 storage made to behave like float16: every row rounded after the update."""
    for table in trainer.layer.tables:
        keys, rows = table.params.export()
        table.params.upsert(keys, tf.constant(round16(rows.numpy())))


def assert_same_state(a, b, what):
    assert sorted(a) == sorted(b), f"{what}: {sorted(set(a) ^ set(b))[:6]}"
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=f"{what}: {k}")


@pytest.mark.tfra
@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_equals_float32_rounded_after_each_update(optimizer):
    half, plain = Trainer(optimizer, name="h16", storage="float16"), Trainer(optimizer, name="h32")
    for s in range(5):
        (_, out_half), (_, out_plain) = half.step(batch(s)), plain.step(batch(s))
        round_rows(plain)
        for f in out_half:
            a, b = out_half[f], out_plain[f]
            if isinstance(a, tf.RaggedTensor):
                a, b = a.flat_values, b.flat_values
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"step {s} output {f}")
        assert all(int(t.params.size()) == 0 for t in half.layer.tables), "rows left in flight"
    state = half.rows()
    assert_same_state(state, plain.rows(), "after 5 steps")
    for (_, _, what), v in state.items():
        if what == "row":
            np.testing.assert_array_equal(round16(v), v)


# --- with replication: mixed precision ----------------------------------------------------------------------------

def exported_rows(tables):
    """Every value of the tables' rows, flat (the groups' dims differ)."""
    return np.concatenate([t.rows.export()[1].numpy().ravel() for t in tables])


@pytest.mark.tfra
def test_replicated_rows_stay_float32_and_moves_round_the_leaving_rows():
    t = Trainer("adagrad", fr.HotReplication(rows=4), name="mix", storage="float16")
    rl.choose_hot_set(t.layer, [batch(s) for s in range(3)])
    for s in range(4):
        t.step(batch(s))
    assert all(h.store is None for h in t.layer.hot_tables), "replicated rows must stay float32"
    hot_rows, cold_rows = exported_rows(t.layer.hot_tables), exported_rows(t.layer.tables)
    assert len(hot_rows) and (round16(hot_rows) != hot_rows).any(), "hot rows look rounded to float16"
    np.testing.assert_array_equal(round16(cold_rows), cold_rows)
    before = t.rows()
    for g in range(len(t.layer.groups)):  # every hot pair leaves: rows (rounded) and slots go to the sharded table
        rl.move_hot_set(t.layer, g, [], [], [], optimizer=t.optimizer)
    assert sum(int(h.size()) for h in t.layer.hot_tables) == 0
    after = t.rows()
    assert sorted(after) == sorted(before), "a row or slot was lost or duplicated by the move"
    for k, v in after.items():
        want = round16(before[k]) if k[2] == "row" else before[k]
        np.testing.assert_array_equal(v, want, err_msg=f"{k} after the move")


@pytest.mark.tfra
def test_checkpoint_of_mixed_storage_continues_exactly(tmp_path):
    comm = SingleProcessComm()

    def trainer():
        return Trainer("adam", fr.HotReplication(rows=5), name="ckpt16", storage="float16")

    reference = trainer()
    rl.choose_hot_set(reference.layer, [batch(s) for s in range(3)])
    for s in range(6):
        reference.step(batch(s))
    want = reference.rows()
    tf.keras.backend.clear_session()

    first = trainer()
    rl.choose_hot_set(first.layer, [batch(s) for s in range(3)])
    for s in range(3):
        first.step(batch(s))
    first.counter.assign(3)
    Checkpointer(str(tmp_path), first.model, first.optimizer, first.counter, comm).save()
    tf.keras.backend.clear_session()

    second = trainer()
    assert Checkpointer(str(tmp_path), second.model, second.optimizer, second.counter, comm).restore()["step"] == 3
    assert all(int(t.params.size()) == 0 for t in second.layer.tables), "a restore must write to the store"
    for s in range(3, 6):
        second.step(batch(s))
    assert_same_state(second.rows(), want, "restored and continued")


def test_export_of_float16_storage_predicts_like_the_model(tmp_path):
    """The export holds the stored rows (float16 values, as float32) and the served scores equal the model's."""
    from tf_fusedrec import config as cfg  # noqa: PLC0415
    from tf_fusedrec.train import experiment  # noqa: PLC0415

    config = cfg.load_config("configs/criteo_synthetic.yaml")
    embedding = experiment.make_embedding("fused", config.embedding_features(), config, name="export16",
                                          storage="float16")
    model = experiment.make_model(config, embedding)
    optimizer = fr.train.make_optimizer(model, default="adam")
    ds = experiment.make_dataset(config, 32, 0, 1)
    pipe = fr.train.TrainPipeline(model, optimizer, experiment.binary_cross_entropy(), ds)
    for _ in range(3):
        pipe.progress()
    features, _ = next(iter(experiment.make_dataset(config, 32, 0, 1, held_out=True)))
    want = model(features, training=False).numpy()
    fr.export.export_model(model, str(tmp_path / "export"), example=features)
    served = fr.export.load_model(str(tmp_path / "export"))
    got = served.predict({k: v.numpy() if isinstance(v, tf.Tensor) else v for k, v in features.items()})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
