"""Admission and expiry (FusedEmbedding(admission=fr.Admission(...), expiry=fr.Expiry(...)),
tf_fusedrec/distributed/admission.py) on one worker, both table backends.

* min_count 1 trains exactly as no admission (outputs, losses, rows and optimizer slots bit for bit): SGD, Adagrad
  and Adam, eager and tf.function;
* min_count 3 against a NumPy reference of the whole process (per (feature, id) counts, initial rows read and not
  inserted, dropped gradients, admission on the 3rd read, SGD updates from then on), with and without expiry;
  an id read twice has no row, no slot, and reads its Hashed row; inference counts nothing; a constant initializer's
  waiting ids read its row;
* expiry removes exactly the rows (with their optimizer slots) a simulation says were not updated for `steps` steps;
* a Checkpointer round trip keeps the counts (training goes on equal), and a checkpoint written without admission
  restores empty counts; it keeps expiry's clocks too: the restored layer expires, step after step, the rows the
  uninterrupted run expires;
* bad policies and config keys are ValueErrors naming them.
The 2-worker run is tests/distributed/test_horovod.py::test_admission_two_workers_equal_one_worker.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec import config as cfg
from tf_fusedrec import initializers
from tf_fusedrec.distributed.comm import get_comm
from tf_fusedrec.distributed.group_lookup import unified_keys
from tf_fusedrec.train.checkpoint import Checkpointer

BACKENDS = ["tfra", "native"]
DIM, LR, VOCAB = 4, 0.1, 12


class Holder(tf.Module):
    """What Checkpointer needs of a model: the embedding layer among its submodules, the dense weight."""

    def __init__(self, layer, w):
        super().__init__()
        self.emb, self.w = layer, w


class Model:
    """Two features of one group (packed keys) and a multi-hot one of another, under a linear model; `model`,
    `optimizer` and `counter` are what a Checkpointer takes."""

    def __init__(self, backend, optimizer="sgd", admission=None, expiry=None, mode="function", name="adm",
                 initializer=None):
        opt = {"name": optimizer, "learning_rate": LR}
        features = [fr.Feature("a", dim=DIM, max_id_bits=8, optimizer=opt),
                    fr.Feature("b", dim=DIM, max_id_bits=8, optimizer=opt),
                    fr.Feature("tags", dim=3, max_id_bits=8, combiner="sum", optimizer=opt)]
        self.layer = fr.FusedEmbedding(features, table_backend=backend, admission=admission, expiry=expiry,
                                       initializer=initializer, name=name)
        self.w = tf.Variable(tf.random.stateless_normal([DIM * 2 + 3, 1], seed=[1, 2]) * 0.3)
        self.optimizer = fr.train.make_optimizer(self.layer, default="sgd")
        self.counter = tf.Variable(0, dtype=tf.int64)
        self.model = Holder(self.layer, self.w)
        self.step = tf.function(self._step) if mode == "function" else self._step

    def _step(self, inputs):
        with tf.GradientTape() as tape:
            out = self.layer(inputs, training=True)
            x = tf.concat([out["a"], out["b"], out["tags"]], axis=1)
            loss = tf.reduce_mean(tf.square(x @ self.w - 1.0))
        variables = self.layer.trainable_variables + [self.w]
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss, out

    def state(self):
        """{(group, key, what): row} of every row and optimizer slot held."""
        out = {}
        for g, table in enumerate(self.layer.tables):
            self.optimizer.create_slots([table.trainable])
            keys = table.export()[0]
            for what, part in [("row", table.rows)] + self.optimizer.slot_tables(table.trainable):
                values, exists = part.lookup(keys, return_exists=True)
                for k, v, e in zip(keys.numpy(), values.numpy(), exists.numpy()):
                    if e:
                        out[(g, int(k), what)] = v
        return out

    def key(self, name, i):
        """(group index, table key) of id i of a feature."""
        for g, group in enumerate(self.layer.groups):
            if name in group.feature_names:
                key = unified_keys(tf.constant([i], tf.int64), tf.constant([group.category_of(name)], tf.int32),
                                   group.num_categories, group.encoding)
                return g, int(key[0])
        raise KeyError(name)

    def counts(self):
        """{(group, key): count} of the keys not admitted yet."""
        out = {}
        for g, table in enumerate(self.layer.tables):
            keys, counts = table.admission.export()
            out.update({(g, int(k)): int(c) for k, c in zip(keys.numpy(), counts.numpy())})
        return out


def batch(step, seed=0):
    rng = np.random.default_rng([seed, step])
    lengths = rng.integers(0, 4, 6)
    return {"a": tf.constant(rng.zipf(1.4, 6) % VOCAB, tf.int64), "b": tf.constant(rng.zipf(1.4, 6) % VOCAB, tf.int64),
            "tags": tf.RaggedTensor.from_row_lengths(rng.zipf(1.4, int(lengths.sum())) % VOCAB, lengths)}


def assert_same_state(got, want, what):
    assert sorted(got) == sorted(want), f"{what}: {sorted(set(got) ^ set(want))[:6]}"
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"{what}: {k}")


# --- min_count 1 is no admission -------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("optimizer, mode", [("sgd", "function"), ("adagrad", "function"), ("adam", "function"),
                                             ("adam", "eager")])
def test_min_count_one_equals_no_admission(backend, optimizer, mode):
    plain = Model(backend, optimizer, mode=mode, name="plain")
    admit = Model(backend, optimizer, admission=fr.Admission(1), mode=mode, name="admit")
    for step in range(8):
        (loss_p, out_p), (loss_a, out_a) = plain.step(batch(step)), admit.step(batch(step))
        assert float(loss_a) == float(loss_p), f"loss at step {step}"
        for name in out_p:
            np.testing.assert_array_equal(out_a[name].numpy(), out_p[name].numpy(), err_msg=f"{name} at {step}")
    assert_same_state(admit.state(), plain.state(), f"{optimizer} rows and slots")
    assert admit.counts() == {}
    assert all(s["dropped"] == 0 and s["waiting"] == 0 for s in admit.layer.admission_statistics().values())


# --- min_count 3 against a NumPy reference ---------------------------------------------------------------------------

class Reference:
    """One feature's table with admission and expiry, SGD, loss = sum((row of each id - 0.5)^2), in NumPy float64:
    rows held, counts of the ids not admitted, last step each held row was read, dropped gradients."""

    def __init__(self, min_count, expiry_steps=None):
        self.min_count, self.expiry_steps = min_count, expiry_steps
        self.rows, self.counts, self.last, self.clock, self.dropped = {}, {}, {}, 0, 0

    @staticmethod
    def initial(i):
        return initializers.hashed_rows_numpy([i], [initializers.feature_salt(0, "a")], DIM, 0.05)[0]

    def step(self, ids):
        self.clock += 1
        read = {}
        for i in np.unique(ids).tolist():
            if i not in self.rows:
                self.counts[i] = self.counts.get(i, 0) + 1
                if self.counts[i] < self.min_count:
                    self.dropped += 1
                    read[i] = self.initial(i)
                    continue
                del self.counts[i]
                self.rows[i] = self.initial(i).astype(np.float64)
            self.last[i] = self.clock
            read[i] = self.rows[i].copy()
        out = np.stack([read[i] for i in ids.tolist()])
        for i in set(ids.tolist()) & set(self.rows):
            self.rows[i] = self.rows[i] - LR * 2 * (read[i] - 0.5) * int((ids == i).sum())
        if self.expiry_steps is not None:
            for i in [i for i in self.rows if self.clock - self.last[i] >= self.expiry_steps]:
                del self.rows[i], self.last[i]
        return out


def one_feature(backend, admission, expiry=None, name="ref", initializer=None):
    layer = fr.FusedEmbedding([fr.Feature("a", dim=DIM, max_id_bits=8, optimizer={"name": "sgd",
                                                                                    "learning_rate": LR})],
                              table_backend=backend, admission=admission, expiry=expiry, initializer=initializer,
                              name=name)
    optimizer = fr.train.make_optimizer(layer, default="sgd")

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            out = layer({"a": ids}, training=True)["a"]
            loss = tf.reduce_sum(tf.square(out - 0.5))
        optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))
        return out

    return layer, optimizer, step


def held_rows(layer):
    """{id: row} of the table."""
    keys, rows = layer.tables[0].export()
    ids = layer.sharded_tables()[0].ids_of_keys(keys.numpy())
    return dict(zip(ids.tolist(), rows.numpy()))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("expiry_steps", [None, 2])
def test_min_count_three_follows_the_reference(backend, expiry_steps):
    expiry = None if expiry_steps is None else fr.Expiry(expiry_steps, interval=1)
    layer, _, step = one_feature(backend, fr.Admission(3), expiry)
    ref = Reference(3, expiry_steps)
    rng = np.random.default_rng(5)
    for s in range(14):
        ids = rng.integers(0, 16, 5).astype(np.int64)
        want = ref.step(ids)
        np.testing.assert_allclose(step(tf.constant(ids)).numpy(), want, rtol=1e-6, atol=1e-7, err_msg=f"step {s}")
        held = held_rows(layer)
        assert sorted(held) == sorted(ref.rows), f"rows held after step {s}"
        for i, row in ref.rows.items():
            np.testing.assert_allclose(held[i], row, rtol=1e-6, atol=1e-7, err_msg=f"row {i} after step {s}")
        stats = layer.admission_statistics()[layer.groups[0].name]
        assert stats == {"waiting": len(ref.counts), "dropped": ref.dropped}, f"step {s}"
    assert ref.dropped > 0 and ref.counts
    if expiry_steps is not None:
        assert layer.expiry_statistics()[layer.groups[0].name]["expired"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_id_read_twice_has_no_row_until_the_third_read(backend):
    layer, _, step = one_feature(backend, fr.Admission(3), name="third")
    init = Reference.initial(7)
    ids = tf.constant([7, 7], tf.int64)  # twice in one batch: one read
    for read in (1, 2):
        np.testing.assert_array_equal(step(ids).numpy(), [init, init], err_msg=f"read {read}")
        assert held_rows(layer) == {} and int(layer.tables[0].size()) == 0, f"read {read} inserted a row"
        np.testing.assert_array_equal(layer({"a": ids}, training=False)["a"].numpy(), [init, init])
    assert layer.admission_statistics()[layer.groups[0].name] == {"waiting": 1, "dropped": 2}
    np.testing.assert_array_equal(step(ids).numpy(), [init, init])  # the 3rd read: admitted, reads its initial row
    np.testing.assert_allclose(held_rows(layer)[7], init - LR * 2 * 2 * (init - 0.5), rtol=1e-6)
    assert layer.admission_statistics()[layer.groups[0].name] == {"waiting": 0, "dropped": 2}


@pytest.mark.parametrize("backend", BACKENDS)
def test_waiting_ids_have_no_slots_and_inference_counts_nothing(backend):
    model = Model(backend, "adam", admission=fr.Admission(2), name="slots")
    model.layer(batch(0), training=False)
    assert model.counts() == {}
    model.step(batch(0))
    model.step(batch(1))  # admits the keys of both batches
    state, counts = model.state(), model.counts()
    assert counts and all(c == 1 for c in counts.values())
    held = {(g, k) for g, k, _ in state}
    assert held and not held & set(counts), "a waiting key holds a row"
    for g, k in held:  # every admitted key has its row and both Adam slots
        assert {w for gg, kk, w in state if (gg, kk) == (g, k)} == {"row", "m", "v"}
    for g, table in enumerate(model.layer.tables):
        waiting = tf.constant([k for gg, k in counts if gg == g], tf.int64)
        for what, part in [("row", table.rows)] + model.optimizer.slot_tables(table.trainable):
            assert not part.lookup(waiting, return_exists=True)[1].numpy().any(), f"a waiting key has a {what}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_waiting_ids_read_a_constant_initializer(backend):
    layer, _, step = one_feature(backend, fr.Admission(2), name="const",
                                 initializer=tf.keras.initializers.Constant(0.25))
    np.testing.assert_array_equal(step(tf.constant([3], tf.int64)).numpy(), np.full([1, DIM], 0.25, np.float32))
    assert held_rows(layer) == {}
    step(tf.constant([3], tf.int64))
    np.testing.assert_allclose(held_rows(layer)[3], np.full(DIM, 0.25 - LR * 2 * (0.25 - 0.5)), rtol=1e-6)


# --- expiry ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("steps, interval", [(1, 1), (3, 1), (2, 3)])
def test_expiry_removes_the_rows_not_updated_for_steps(backend, steps, interval):
    model = Model(backend, "adagrad", expiry=fr.Expiry(steps, interval=interval), name="exp")
    last, expired = {}, 0  # (feature, id) -> the step that last read (and updated) its row
    for s in range(1, 13):
        inputs = batch(s)
        model.step(inputs)
        for name, values in inputs.items():
            values = values.flat_values if isinstance(values, tf.RaggedTensor) else values
            for i in set(values.numpy().tolist()):
                last[(name, i)] = s
        if s % interval == 0:
            gone = [k for k, at in last.items() if s - at >= steps]
            expired += len(gone)
            for k in gone:
                del last[k]
        state = model.state()
        held = {(g, k) for g, k, _ in state}
        want = {model.key(name, i) for name, i in last}
        assert held == want, f"rows held after step {s}"
        assert {(g, k) for g, k, w in state if w == "accumulator"} == want, "slots not removed with their rows"
    assert sum(x["expired"] for x in model.layer.expiry_statistics().values()) == expired > 0


# --- checkpoints ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint_keeps_the_counts(tmp_path, backend):
    comm = get_comm("single")
    writer = Model(backend, "adagrad", admission=fr.Admission(3), name="ck")
    for step in range(4):
        writer.step(batch(step))
    writer.counter.assign(4)
    Checkpointer(str(tmp_path), writer.model, writer.optimizer, writer.counter, comm).save()
    counts, state = writer.counts(), writer.state()
    assert any(c == 2 for c in counts.values())
    losses = [float(writer.step(batch(step))[0]) for step in range(4, 8)]
    tf.keras.backend.clear_session()

    reader = Model(backend, "adagrad", admission=fr.Admission(3), name="ck")
    assert Checkpointer(str(tmp_path), reader.model, reader.optimizer, reader.counter, comm).restore()["step"] == 4
    assert reader.counts() == counts
    assert_same_state(reader.state(), state, "restored rows and slots")
    for step, want in zip(range(4, 8), losses):
        np.testing.assert_allclose(float(reader.step(batch(step))[0]), want, rtol=1e-6, err_msg=f"loss at {step}")
    assert reader.counts() == writer.counts()
    assert_same_state(reader.state(), writer.state(), "rows and slots after training on")


def access(model):
    """Per table: (sorted [(key, count, last)], clock, expired)."""
    out = []
    for table in model.layer.tables:
        keys, counts, lasts, clock = (np.asarray(x) for x in table.access_status())
        entries = sorted(zip(keys.tolist(), counts.tolist(), lasts.tolist()))
        out.append((entries, int(clock), int(table.expired.numpy())))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint_keeps_the_expiry_clocks(tmp_path, backend):
    comm = get_comm("single")
    expiry = fr.Expiry(3, interval=2)
    writer = Model(backend, "adagrad", expiry=expiry, name="xp")
    for step in range(5):
        writer.step(batch(step))
    writer.counter.assign(5)
    Checkpointer(str(tmp_path), writer.model, writer.optimizer, writer.counter, comm).save()
    saved, state = access(writer), writer.state()
    assert all(clock == 5 for _, clock, _ in saved)
    held = []
    for step in range(5, 11):
        writer.step(batch(step))
        held.append(sorted(writer.state()))
    tf.keras.backend.clear_session()

    reader = Model(backend, "adagrad", expiry=expiry, name="xp")
    assert Checkpointer(str(tmp_path), reader.model, reader.optimizer, reader.counter, comm).restore()["step"] == 5
    assert access(reader) == saved
    assert_same_state(reader.state(), state, "restored rows and slots")
    for step, want in zip(range(5, 11), held):
        reader.step(batch(step))
        assert sorted(reader.state()) == want, f"rows and slots held after step {step}"
    assert access(reader) == access(writer)
    assert reader.layer.expiry_statistics() == writer.layer.expiry_statistics()
    assert sum(e for _, _, e in access(writer)) > sum(e for _, _, e in saved), "nothing expired after the restore"


def test_checkpoint_without_counts_restores_empty_counts(tmp_path):
    comm = get_comm("single")
    writer = Model("native", "sgd", name="old")
    writer.step(batch(0))
    Checkpointer(str(tmp_path), writer.model, writer.optimizer, writer.counter, comm).save()
    state = writer.state()
    tf.keras.backend.clear_session()
    reader = Model("native", "sgd", admission=fr.Admission(2), name="old")
    assert Checkpointer(str(tmp_path), reader.model, reader.optimizer, reader.counter, comm).restore() is not None
    assert reader.counts() == {}
    assert_same_state(reader.state(), state, "restored rows")


# --- errors and config -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, match", [
    (lambda: fr.Admission(0), "Admission: min_count must be an integer >= 1, got 0"),
    (lambda: fr.Admission(True), "Admission: min_count must be an integer >= 1"),
    (lambda: fr.Admission(2.5), "Admission: min_count must be an integer >= 1"),
    (lambda: fr.Expiry(0), "Expiry: steps must be an integer >= 1, got 0"),
    (lambda: fr.Expiry(5, interval=0), "Expiry: interval must be an integer >= 1, got 0"),
    (lambda: fr.FusedEmbedding([fr.Feature("a", dim=4)], admission=3, name="e1"),
     "e1: admission must be None or fr.Admission"),
    (lambda: fr.FusedEmbedding([fr.Feature("a", dim=4)], expiry="x", name="e2"),
     "e2: expiry must be None or fr.Expiry"),
])
def test_bad_policies_are_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_policies_round_trip_through_the_config():
    layer = fr.FusedEmbedding([fr.Feature("a", dim=4)], admission=fr.Admission(4), expiry=fr.Expiry(9, interval=3),
                              name="rt")
    config = layer.get_config()
    assert config["admission"] == {"min_count": 4} and config["expiry"] == {"steps": 9, "interval": 3}
    tf.keras.backend.clear_session()
    again = fr.FusedEmbedding.from_config(config)
    assert again.admission == fr.Admission(4) and again.expiry == fr.Expiry(9, interval=3)


def raw_config(**embedding):
    return {"features": [{"name": "a", "dim": 4, "vocab": 10}], "embedding": embedding}


@pytest.mark.parametrize("key, value, match", [
    ("admission_min_count", 0, "config.embedding.admission_min_count: must be a positive int or null, got 0"),
    ("admission_min_count", "5", "config.embedding.admission_min_count: must be a positive int or null"),
    ("expiry_steps", -1, "config.embedding.expiry_steps: must be a positive int or null, got -1"),
    ("expiry_steps", True, "config.embedding.expiry_steps: must be a positive int or null, got True"),
    ("expiry_interval", None, "config.embedding.expiry_interval: must be a positive int, got None"),
    ("expiry_interval", 0, "config.embedding.expiry_interval: must be a positive int, got 0"),
])
def test_bad_config_keys_are_named(key, value, match):
    with pytest.raises(ValueError, match=match):
        cfg.parse_config(raw_config(**{key: value}))


def test_config_keys():
    embedding = cfg.parse_config(raw_config(admission_min_count=3, expiry_steps=50)).embedding
    assert (embedding.admission_min_count, embedding.expiry_steps, embedding.expiry_interval) == (3, 50, 100)
    default = cfg.parse_config(raw_config()).embedding
    assert (default.admission_min_count, default.expiry_steps) == (None, None)


def test_train_app_takes_the_flags_over_the_config():
    from tf_fusedrec.train import app  # noqa: PLC0415

    config = cfg.parse_config(raw_config(admission_min_count=3, expiry_steps=50))
    plan = app.plan_of(app.parse_args(["--steps", "2"]), config)
    assert (plan.admission, plan.expiry) == (fr.Admission(3), fr.Expiry(50, interval=100))
    plan = app.plan_of(app.parse_args(["--admission-min-count", "5", "--expiry-steps", "7", "--expiry-interval", "2"]),
                       config)
    assert (plan.admission, plan.expiry) == (fr.Admission(5), fr.Expiry(7, interval=2))
    plan = app.plan_of(app.parse_args(["--embedding", "per_feature"]), config)  # the TFRA baseline has no policies
    assert (plan.admission, plan.expiry) == (None, None)
    plan = app.plan_of(app.parse_args([]), cfg.parse_config(raw_config()))
    assert (plan.admission, plan.expiry) == (None, None)
