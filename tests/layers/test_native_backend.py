"""FusedEmbedding(table_backend="native") against the TFRA backend on one worker (tf_fusedrec/distributed/
native_table.py; the op itself is tested in tests/ops/test_native_table.py).

* 50 training steps give the same outputs, losses, rows and optimizer slots (1e-6 relative): SGD, Adagrad and Adam,
  packed and hashed groups, ragged and padded multi-hot, eager and tf.function, float32 and float16 storage, with
  eviction (the same rows evicted);
* a fr.train.Checkpointer checkpoint written with one backend restores into the other and training goes on equal;
  with eviction, the access status goes with it: the restored table evicts what the other backend's uninterrupted
  run evicts;
* statistics, the summary's table bytes and export read native tables like TFRA ones;
* hot rows replicated in a native table train like the plain layer, and survive a hot-set move;
* SGD with momentum and Nesterov and FTRL train exactly like the TFRA backend (the same formulas), RMSprop with
  momentum nearly (tests/ops/test_native_optimizers.py: Keras 3's formula against Keras 2's);
* Keras' random initializers (Keras 3's and tf_keras' RandomNormal, TruncatedNormal, RandomUniform) give the rows of
  the native table's per-(seed, category, id) streams;
* what the native backend does not implement (amsgrad, gradient clipping, an unknown hyperparameter, another Keras
  initializer, an unknown backend) is a ValueError naming the layer or group.
The 2-worker run is tests/distributed/test_horovod.py::test_native_backend_two_workers_equal_one_worker.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec.distributed import replication as rl
from tf_fusedrec.distributed.comm import SingleProcessComm
from tf_fusedrec.train.checkpoint import Checkpointer

from tests.layers.test_hot_replication import Trainer, assert_same, batch

STEPS = 50


def train_both(steps, **kwargs):
    """Trains a TFRA and a native Trainer side by side on the same batches, checking outputs and losses each step."""
    tfra = Trainer(name="tfra_emb", table_backend="tfra", **kwargs)
    native = Trainer(name="native_emb", table_backend="native", **kwargs)
    for step in range(steps):
        inputs = batch(step)
        (loss_t, out_t), (loss_n, out_n) = tfra.step(inputs), native.step(inputs)
        np.testing.assert_allclose(loss_n.numpy(), loss_t.numpy(), rtol=1e-6, err_msg=f"loss at step {step}")
        for name in out_t:
            t, n = out_t[name], out_n[name]
            if isinstance(t, tf.RaggedTensor):
                t, n = t.flat_values, n.flat_values
            np.testing.assert_allclose(n.numpy(), t.numpy(), rtol=1e-5, atol=1e-7, err_msg=f"{name} at step {step}")
    return tfra, native


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "hashed"])
def test_native_trains_like_tfra(optimizer, packed):
    tfra, native = train_both(STEPS, optimizer=optimizer, packed=packed)
    assert_same(native.rows(), tfra.rows(), f"{optimizer} rows and slots")
    assert int(native.layer.tables[0].size()) == int(tfra.layer.tables[0].size())


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("mode", ["function", "eager"])
def test_update_skips_deduplication_only_for_one_lookups_keys(optimizer, mode, monkeypatch):
    """A native table's update passes distinct_keys=True (no deduplication pass) only when its gradient's indices
    are its last lookup's keys, which are unique. The layer called on two batches in one tape (the TFRA backend
    cannot: its ShadowVariable refuses a second lookup in a tape) aggregates two lookups' keys, repeated keys among
    them: that update must deduplicate and sum them. Against the same training with every update deduplicating,
    rows and slots are bit for bit equal after 5 steps of one call and 5 of two, and the flags are as said."""
    from tf_fusedrec.ops import native_table_ops  # noqa: PLC0415

    flags = []
    apply_sparse = native_table_ops.native_table_apply_sparse

    def recording(*args, forced=None, **kwargs):
        flags.append(kwargs["distinct_keys"])
        if forced is not None:
            kwargs["distinct_keys"] = forced
        return apply_sparse(*args, **kwargs)

    trainers = {}
    for forced in (None, False):
        trainer = Trainer(optimizer, name=f"calls_{forced}", table_backend="native", mode="eager")
        table = trainer.layer.tables[0]
        monkeypatch.setattr(table, "ops", type("Ops", (), {
            "__getattr__": lambda self, n: getattr(native_table_ops, n),
            "native_table_apply_sparse": staticmethod(lambda *a, f=forced, **k: recording(*a, forced=f, **k))})())
        trainers[forced] = trainer

    def calls(trainer, batches):
        with tf.GradientTape() as tape:
            losses = []
            for inputs in batches:
                out = trainer.layer(inputs)
                x = tf.concat([out["a"], out["b"], out["tags"], tf.reduce_sum(out["hist"], axis=1)], axis=1)
                losses.append(tf.reduce_mean(tf.square(x @ trainer.w - 1.0)))
            loss = tf.add_n(losses)
        variables = trainer.layer.trainable_variables + [trainer.w]
        trainer.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    for count in (1, 2):
        steps = {k: (tf.function(lambda *b, t=t: calls(t, b)) if mode == "function" else (lambda *b, t=t: calls(t, b)))
                 for k, t in trainers.items()}
        flags.clear()
        for step in range(5):
            batches = [batch(step, seed=s) for s in range(count)]
            losses = {k: fn(*batches).numpy() for k, fn in steps.items()}
            assert losses[None] == losses[False], f"loss at step {step}, {count} calls"
        # What the update of the unforced trainer asked for (traced once, or run each step eagerly).
        assert set(flags[0::2]) == {count == 1}, (count, flags)
    assert_same(trainers[None].rows(), trainers[False].rows(), f"{optimizer} rows and slots")
    a, b = trainers[None].rows(), trainers[False].rows()
    assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("optimizer", [
    {"name": "sgd", "momentum": 0.9},
    {"name": "sgd", "momentum": 0.9, "nesterov": True},
    {"name": "ftrl", "l1_regularization_strength": 0.001, "l2_regularization_strength": 0.01,
     "l2_shrinkage_regularization_strength": 0.01, "beta": 0.1},
], ids=["momentum", "nesterov", "ftrl"])
def test_native_momentum_and_ftrl_train_like_tfra(optimizer):
    """Keras 2's SGD with momentum and Ftrl (TF's kernels, what the TFRA backend runs) compute Keras 3's formulas,
    which the native table implements: the same training, slots (momentum; accumulator, linear) included."""
    tfra, native = train_both(STEPS, optimizer=optimizer)
    assert_same(native.rows(), tfra.rows(), f"{optimizer['name']} rows and slots")


def test_native_rmsprop_trains_near_tfra():
    """RMSprop with momentum: Keras 3's formula (native) against Keras 2's kernel (TFRA), which takes 1 - rho in
    float32 and orders the rms update as TF's kernel: losses within 1e-5 and rows and slots within 1e-4 (relative)
    after 20 steps."""
    tfra = Trainer({"name": "rmsprop", "momentum": 0.5, "centered": True}, name="tfra_rms", table_backend="tfra")
    native = Trainer({"name": "rmsprop", "momentum": 0.5, "centered": True}, name="native_rms",
                     table_backend="native")
    for step in range(20):
        (loss_t, _), (loss_n, _) = tfra.step(batch(step)), native.step(batch(step))
        np.testing.assert_allclose(loss_n.numpy(), loss_t.numpy(), rtol=1e-5, err_msg=f"loss at step {step}")
    want = tfra.rows()
    got = native.rows()
    assert sorted(got) == sorted(want) and {k[2] for k in got} == {"row", "rms", "momentum", "mg"}
    for key, row in got.items():
        np.testing.assert_allclose(row, want[key], rtol=1e-4, atol=1e-6, err_msg=f"{key}")


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_native_trains_like_tfra_eagerly(optimizer):
    tfra, native = train_both(8, optimizer=optimizer, mode="eager")
    assert_same(native.rows(), tfra.rows(), "eager rows and slots")


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_native_float16_storage_trains_like_tfra_float16(optimizer, rounding):
    """float16 rows: the native table rounds a new key's initial row when it inserts it, TFRA's only after the
    key's first update (HalfRows stages it as float32), so the two agree up to one float16 rounding (2**-11
    relative), the tolerance of the other float16 comparisons (test_horovod's 2 workers vs 1); the native rows are
    float16 values, and float16 storage costs both backends the same bytes. Stochastic rounding draws the same bits
    in both (salt, key, update count, column) and is monotone in the value for given bits, so rows one rounding
    apart stay within about one rounding (tests/layers/test_stochastic_rounding.py checks each backend bit for bit
    against the NumPy reference)."""
    tfra = Trainer(optimizer, name="tfra_h16", table_backend="tfra", storage="float16", rounding=rounding)
    native = Trainer(optimizer, name="native_h16", table_backend="native", storage="float16", rounding=rounding)
    for step in range(20):
        (loss_t, _), (loss_n, _) = tfra.step(batch(step)), native.step(batch(step))
        np.testing.assert_allclose(loss_n.numpy(), loss_t.numpy(), rtol=2e-3, err_msg=f"loss at step {step}")
    rows_t, rows_n = tfra.rows(), native.rows()
    assert sorted(rows_n) == sorted(rows_t)
    for key, row in rows_n.items():
        if key[2] == "row":
            np.testing.assert_array_equal(row.astype(np.float16).astype(np.float32), row, err_msg=f"{key}")
        np.testing.assert_allclose(row, rows_t[key], rtol=2e-3, atol=2e-4, err_msg=f"{key}")
    assert native.layer.table_bytes() == tfra.layer.table_bytes()


def test_native_eviction_evicts_like_tfra():
    eviction = fr.Eviction(capacity=6, policy="lfu", interval=3)
    tfra, native = train_both(20, optimizer="adagrad", eviction=eviction)
    assert_same(native.rows(), tfra.rows(), "rows and slots after eviction")
    assert native.layer.eviction_statistics() == tfra.layer.eviction_statistics()
    assert tfra.layer.eviction_statistics()[tfra.layer.groups[0].name]["evicted"] > 0


@pytest.mark.parametrize("source,target", [("native", "tfra"), ("tfra", "native")])
def test_restored_eviction_evicts_like_the_other_backend(tmp_path, source, target):
    """The access status (counts, last reads, clock, evicted counters) travels with a checkpoint across backends."""
    eviction = fr.Eviction(capacity=8, policy="lfu", interval=3)
    comm = SingleProcessComm()
    writer = Trainer("adagrad", name="ck", table_backend=source, eviction=eviction)
    for step in range(10):
        writer.step(batch(step))
    writer.counter.assign(10)
    Checkpointer(str(tmp_path), writer.model, writer.optimizer, writer.counter, comm).save()
    held = []
    for step in range(10, 20):
        writer.step(batch(step))
        held.append((sorted(writer.rows()), writer.layer.eviction_statistics()))
    trained_on = writer.rows()
    assert held[0][1] != held[-1][1], "nothing evicted after the restore: the test tests little"
    tf.keras.backend.clear_session()

    reader = Trainer("adagrad", name="ck", table_backend=target, eviction=eviction)
    assert Checkpointer(str(tmp_path), reader.model, reader.optimizer, reader.counter, comm).restore()["step"] == 10
    for step, (want, statistics) in zip(range(10, 20), held):
        reader.step(batch(step))
        assert sorted(reader.rows()) == want, f"rows held after step {step}"
        assert reader.layer.eviction_statistics() == statistics, f"after step {step}"
    assert_same(reader.rows(), trained_on, "rows and slots after training on")


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_native_replicated_layer_trains_like_the_plain_tfra_one(optimizer):
    """Hot rows in a replicated native table: the same training as the plain TFRA layer; a hot-set move keeps
    every row and slot (the native table drops a key's slots with its row, so the move takes every part first)."""
    plain = Trainer(optimizer, name="plain_tfra", table_backend="tfra")
    hot = Trainer(optimizer, fr.HotReplication(rows=6), name="hot_native", table_backend="native")
    rl.choose_hot_set(hot.layer, [batch(s) for s in range(4)])
    assert [len(s) for s in hot.layer.hot_sets] == [6, 6]
    for step in range(8):
        (want, _), (got, _) = plain.step(batch(step)), hot.step(batch(step))
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, err_msg=f"loss at step {step}")
    assert int(hot.layer.hot_tables[0].size()) > 0
    assert_same(hot.rows(), plain.rows(), "rows and slots")
    rl.repeek(hot.layer, [batch(s) for s in range(20, 24)], optimizer=hot.optimizer)
    assert_same(hot.rows(), plain.rows(), "rows and slots after a hot-set move")
    for step in range(8, 12):
        (want, _), (got, _) = plain.step(batch(step)), hot.step(batch(step))
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, err_msg=f"loss at step {step}")


@pytest.mark.parametrize("source,target", [("native", "tfra"), ("tfra", "native")])
def test_checkpoint_restores_across_backends(tmp_path, source, target):
    """Checkpoints match tables by name (the layer's and the group's) and slots by their TFRA names."""
    comm = SingleProcessComm()
    writer = Trainer("adam", name="ck", table_backend=source)
    for step in range(6):
        writer.step(batch(step))
    writer.counter.assign(6)
    Checkpointer(str(tmp_path), writer.model, writer.optimizer, writer.counter, comm).save()
    saved = writer.rows()
    losses = [float(writer.step(batch(step))[0]) for step in range(6, 12)]
    trained_on = writer.rows()
    tf.keras.backend.clear_session()  # the reader's tables take the same names

    reader = Trainer("adam", name="ck", table_backend=target)
    restored = Checkpointer(str(tmp_path), reader.model, reader.optimizer, reader.counter, comm).restore()
    assert restored["step"] == 6
    assert_same(reader.rows(), saved, "restored rows and slots")
    for step, want in zip(range(6, 12), losses):
        np.testing.assert_allclose(float(reader.step(batch(step))[0]), want, rtol=1e-6, err_msg=f"loss at {step}")
    assert_same(reader.rows(), trained_on, "rows and slots after training on")


def test_statistics_and_config_round_trip():
    t = Trainer("adagrad", name="stats_native", table_backend="native")
    t.step(batch(0))
    stats = t.layer.statistics()
    assert int(stats["a"]["ids"]) == 8
    config = t.layer.get_config()
    assert config["table_backend"] == "native"
    again = fr.FusedEmbedding.from_config({**config, "name": "stats_native_2"})
    assert again.table_backend == "native"


@pytest.mark.parametrize("kwargs,message", [
    ({"optimizer": {"name": "adam", "amsgrad": True}}, "refused.*implements adam without amsgrad"),
    ({"optimizer": {"name": "sgd", "clipnorm": 1.0}}, r"refused.*implements sgd with .*got also \['clipnorm'\]"),
    ({"optimizer": {"name": "sgd", "weight_decay": 0.01}}, r"got also \['weight_decay'\]"),
    ({"optimizer": {"name": "rmsprop", "momentum": -0.5}}, "refused.*rmsprop momentum must be >= 0"),
    ({"initializer": tf.keras.initializers.GlorotUniform()}, "Hashed, a Keras Zeros/Ones/Constant"),
    ({"initializer": tf.keras.initializers.RandomUniform(0.5, 0.5)}, "RandomUniform needs minval < maxval"),
    ({"table_backend": "leveldb"}, "table_backend must be one of"),
])
def test_unsupported_choices_are_named(kwargs, message):
    kwargs = {"table_backend": "native", **kwargs}
    with pytest.raises(ValueError, match=message):
        fr.FusedEmbedding([fr.Feature("a", dim=4)], name="refused", **kwargs)


def test_constant_initializer_rows():
    layer = fr.FusedEmbedding([fr.Feature("a", dim=3), fr.Feature("b", dim=3)], name="const_native",
                              initializer=tf.keras.initializers.Constant(0.25), table_backend="native")
    out = layer({"a": tf.constant([1, 2], tf.int64), "b": tf.constant([1], tf.int64)}, training=False)
    np.testing.assert_array_equal(out["a"].numpy(), np.full([2, 3], 0.25, np.float32))
    assert int(layer.tables[0].size()) == 0  # inference inserts nothing


def keras_random_initializers():
    """(Keras, class name, instance) of the random initializers the native table takes: tf.keras' (tf_keras where
    TFRA is installed) and, where importable, Keras 3's."""
    out = [("tf.keras", type(i).__name__, i) for i in (
        tf.keras.initializers.RandomNormal(0.25, 0.5, seed=3), tf.keras.initializers.TruncatedNormal(0.0, 0.2),
        tf.keras.initializers.RandomUniform(-0.5, 1.5, seed=9))]
    try:
        import keras  # noqa: PLC0415
    except ImportError:
        return out
    if keras.__version__.startswith("3."):
        out += [("keras3", type(i).__name__, i) for i in (
            keras.initializers.RandomNormal(0.25, 0.5, seed=3), keras.initializers.TruncatedNormal(0.0, 0.2),
            keras.initializers.RandomUniform(-0.5, 1.5, seed=9))]
    return out


@pytest.mark.parametrize("keras_name,kind,initializer", keras_random_initializers(),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_keras_random_initializer_rows(keras_name, kind, initializer):
    """The layer's native tables draw a Keras random initializer's rows from the per-(seed, category salt, id) stream
    (seed None is 0): its first rows are the reference's, whatever the batch, inference reads them without inserting
    them, and training reads the same."""
    from tf_fusedrec.distributed import native_table  # noqa: PLC0415
    from tf_fusedrec.ops import reference  # noqa: PLC0415

    config = initializer.get_config()
    attrs = native_table._initializer_attrs(initializer, "test")  # noqa: SLF001
    want_attrs = {"RandomNormal": {"init": "normal", "mean": 0.25, "stddev": 0.5, "seed": 3},
                  "TruncatedNormal": {"init": "truncated_normal", "mean": 0.0, "stddev": 0.2, "seed": 0},
                  "RandomUniform": {"init": "uniform", "minval": -0.5, "maxval": 1.5, "seed": 9}}[kind]
    assert attrs == want_attrs, (attrs, config)
    layer = fr.FusedEmbedding([fr.Feature("a", dim=5), fr.Feature("b", dim=5)], initializer=initializer,
                              table_backend="native", name=f"rand_{keras_name.replace('.', '_')}_{kind}")
    ids = {"a": tf.constant([3, 7, 2**30], tf.int64), "b": tf.constant([7, 8], tf.int64)}
    inferred = layer(ids, training=False)
    assert int(layer.tables[0].size()) == 0
    trained = layer(ids, training=True)
    args = {k: v for k, v in attrs.items() if k != "init"}
    for f in ("a", "b"):
        salt = fr.initializers.feature_salt(0, f)
        want = reference.native_table_initial_rows(attrs["init"], ids[f].numpy(), np.full(len(ids[f]), salt),
                                                   5, **args)
        np.testing.assert_array_equal(inferred[f].numpy(), want, err_msg=f)
        np.testing.assert_array_equal(trained[f].numpy(), want, err_msg=f)
