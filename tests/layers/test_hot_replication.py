"""Hot-row replication on one worker (tf_fusedrec/distributed/replication.py, group_lookup.HotReplica): the hot split,
the choice of R, moving rows, checkpoints, and errors. The 2-worker equality runs are in
tests/distributed/test_replication.py.

* unified_keys (the sender's key of a pair) equals category_unique's keys, packed and hashed, random and edge ids;
* a replicated layer trains like the plain one (outputs, losses, rows and optimizer slots, 1e-6), SGD, Adagrad and
  Adam, eager and tf.function, packed and hashed, multi-hot, ragged and [B, L] features; hot_hits counts the ids
  of hot pairs (checked against NumPy);
* coverage and choose_rows against brute force; merge_counts on one worker;
* move_hot_set moves rows and slots both ways, nothing lost or held twice, and training goes on as without it;
* a checkpoint holds the hot set and both tables; restoring continues exactly; one written without replication is
  refused by a replicated model;
* bad arguments are ValueErrors naming the field, the optimizer or the initializer.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec import ops
from tf_fusedrec.distributed import replication as rl
from tf_fusedrec.distributed.comm import SingleProcessComm
from tf_fusedrec.distributed.group_lookup import unified_keys
from tf_fusedrec.train.checkpoint import CheckpointError, Checkpointer

RTOL, ATOL = 1e-6, 1e-7


def features(optimizer, packed=True):
    """optimizer: a name, or a dict with the name and hyperparameters (learning rate 0.1 unless it says)."""
    opt = {"learning_rate": 0.1, **(optimizer if isinstance(optimizer, dict) else {"name": optimizer})}
    out = [fr.Feature("a", dim=4, optimizer=opt), fr.Feature("b", dim=4, optimizer=opt),
           fr.Feature("tags", dim=4, combiner="mean", optimizer=opt),
           fr.Feature("hist", dim=3, optimizer=opt)]
    return [dataclasses.replace(f, max_id_bits=20) for f in out] if packed else out


def batch(step, seed=0):
    rng = np.random.default_rng([seed, step])
    lengths = rng.integers(0, 4, 8)
    hist = (rng.zipf(1.5, (8, 2)) % 15).astype(np.int64)
    hist[rng.random((8, 2)) < 0.2] = -1
    return {"a": tf.constant(rng.zipf(1.5, 8) % 15, tf.int64), "b": tf.constant(rng.zipf(1.5, 8) % 15, tf.int64),
            "tags": tf.RaggedTensor.from_row_lengths(rng.zipf(1.5, int(lengths.sum())) % 15, lengths),
            "hist": tf.constant(hist)}


class Holder(tf.Module):
    """What Checkpointer needs of a model: the embedding layer among its submodules, the dense weight."""

    def __init__(self, layer, w):
        super().__init__()
        self.emb, self.w = layer, w


class Trainer:
    """A FusedEmbedding under a linear model (also used by tests/layers/test_half_storage.py); `model` and `counter`
    are what a Checkpointer takes."""

    def __init__(self, optimizer, replication=None, packed=True, mode="function", name=None, storage="float32",
                 table_backend="tfra", eviction=None, rounding="nearest"):
        name = name or ("plain" if replication is None else "hot")
        self.layer = fr.FusedEmbedding(features(optimizer, packed), replication=replication, storage=storage,
                                       table_backend=table_backend, eviction=eviction, rounding=rounding, name=name)
        self.w = tf.Variable(tf.random.stateless_normal([15, 1], seed=[1, 2]) * 0.3)
        self.optimizer = fr.train.make_optimizer([self.layer], default="sgd")
        self.step = tf.function(self._step) if mode == "function" else self._step
        self.model, self.counter = Holder(self.layer, self.w), tf.Variable(0, dtype=tf.int64)

    def _step(self, inputs):
        with tf.GradientTape() as tape:
            out = self.layer(inputs)
            x = tf.concat([out["a"], out["b"], out["tags"], tf.reduce_sum(out["hist"], axis=1)], axis=1)
            loss = tf.reduce_mean(tf.square(x @ self.w - 1.0))
        variables = self.layer.trainable_variables + [self.w]
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss, out

    def rows(self):
        """{(feature, id, what): row} over the sharded and the replicated table, rows and optimizer slots."""
        out = {}
        for g, group in enumerate(self.layer.groups):
            tables = [self.layer.tables[g]] + (self.layer.hot_tables[g:g + 1] if self.layer.hot_tables else [])
            for table in tables:
                self.optimizer.create_slots([table.trainable])
                slots = self.optimizer.slot_tables(table.trainable)
                for c, name in enumerate(group.feature_names):
                    ids = np.arange(15, dtype=np.int64)
                    keys = unified_keys(tf.constant(ids), tf.fill([15], c), group.num_categories, group.encoding)
                    for what, params in [("row", table.rows)] + slots:
                        values, exists = params.lookup(keys, return_exists=True)
                        for i, v, e in zip(ids, values.numpy(), exists.numpy()):
                            if e:
                                assert (name, int(i), what) not in out, f"{name} {i} {what} held twice"
                                out[(name, int(i), what)] = v
        return out


def assert_same(a, b, what):
    assert sorted(a) == sorted(b), f"{what}: {sorted(set(a) ^ set(b))[:6]}"
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=RTOL, atol=ATOL, err_msg=f"{what}: {k}")


# --- the sender's unified keys ------------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["packed", "hashed"])
def test_unified_keys_equal_category_unique(encoding):
    rng = np.random.default_rng(3)
    high = 2 ** 40 if encoding == "packed" else 2 ** 62
    ids = np.concatenate([rng.integers(0, high, 500), [0, high - 1]]).astype(np.int64)
    if encoding == "hashed":
        ids = np.concatenate([ids, [-1, -(2 ** 63), 2 ** 63 - 1]]).astype(np.int64)
    segments = rng.integers(0, 5, len(ids)).astype(np.int32)
    unique = ops.category_unique(ids, segments, 5, encoding)
    want = tf.gather(unique.unified_keys, unique.inverse).numpy()
    np.testing.assert_array_equal(unified_keys(tf.constant(ids), tf.constant(segments), 5, encoding).numpy(), want)
    empty = unified_keys(tf.zeros([0], tf.int64), tf.zeros([0], tf.int32), 5, encoding)
    assert empty.shape == (0,)


# --- equality with the plain layer --------------------------------------------------------------------------------

@pytest.mark.tfra
@pytest.mark.parametrize("optimizer, packed, mode", [("sgd", True, "function"), ("adagrad", False, "function"),
                                                     ("adam", True, "function"), ("adam", False, "eager")])
def test_replicated_layer_trains_like_the_plain_one(optimizer, packed, mode):
    plain = Trainer(optimizer, None, packed, mode)
    hot = Trainer(optimizer, fr.HotReplication(rows=6), packed, mode)
    reports = rl.choose_hot_set(hot.layer, [batch(s) for s in range(4)])
    assert [r["rows"] for r in reports] == [6, 6] and all(r["chosen_by"] == "rows" for r in reports)
    assert [len(s) for s in hot.layer.hot_sets] == [6, 6]
    for s in range(6):
        want_loss, want = plain.step(batch(s))
        got_loss, got = hot.step(batch(s))
        np.testing.assert_allclose(got_loss, want_loss, rtol=RTOL, err_msg=f"loss {s}")
        for k in want:
            w, g = want[k], got[k]
            if isinstance(w, tf.RaggedTensor):
                w, g = w.flat_values, g.flat_values
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{k} at step {s}")
    np.testing.assert_allclose(hot.w.numpy(), plain.w.numpy(), rtol=RTOL, atol=ATOL)
    rows_hot, rows_plain = hot.rows(), plain.rows()
    assert_same(rows_hot, rows_plain, f"{optimizer} rows and slots")
    assert int(hot.layer.hot_tables[0].size()) > 0  # rows really live in the replicated table
    # Inference reads hot rows from the replicated table.
    for k, v in plain.layer(batch(99), training=False).items():
        g = hot.layer(batch(99), training=False)[k]
        w = v.flat_values if isinstance(v, tf.RaggedTensor) else v
        g = g.flat_values if isinstance(g, tf.RaggedTensor) else g
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"inference {k}")


@pytest.mark.tfra
def test_hot_hits_count_the_ids_of_hot_pairs():
    t = Trainer("sgd", fr.HotReplication(rows=4))
    rl.choose_hot_set(t.layer, [batch(s) for s in range(3)])
    inputs = batch(7)
    t.layer(inputs)
    stats = t.layer.statistics()
    for g, group in enumerate(t.layer.groups):
        hot_keys = set(t.layer.hot_sets[g].keys.numpy().tolist())
        for c, name in enumerate(group.feature_names):
            ids = inputs[name]
            ids = (ids.flat_values if isinstance(ids, tf.RaggedTensor) else tf.reshape(ids, [-1])).numpy()
            ids = ids[ids >= 0]
            keys = unified_keys(tf.constant(ids), tf.fill([len(ids)], c), group.num_categories, group.encoding)
            want = sum(k in hot_keys for k in keys.numpy().tolist())
            assert int(stats[name]["hot_hits"]) == want, name
            assert int(stats[name]["ids"]) == len(ids)
    plain = fr.FusedEmbedding(features("sgd"), name="plain")
    plain(inputs)
    assert all(int(s["hot_hits"]) == 0 for s in plain.statistics().values())


def test_zero_rows_is_no_replication():
    for replication in (0, None, fr.HotReplication(rows=0)):
        layer = fr.FusedEmbedding(features("sgd"), replication=replication, name=f"emb{id(replication)}")
        assert layer.replication is None and not layer.hot_tables
        assert all(g.hot is None for g in layer.group_lookups)


# --- choosing R ---------------------------------------------------------------------------------------------------

def test_coverage_and_choose_rows_against_brute_force():
    rng = np.random.default_rng(0)
    for trial in range(30):
        counts = np.sort(rng.zipf(1.2 + rng.random(), rng.integers(1, 3000)))[::-1]
        rho = rl.coverage(counts, counts.sum())
        assert rho[0] == 0 and np.isclose(rho[-1], 1.0) and np.all(np.diff(rho) >= 0)
        loss = rl.cost_curve(rng.integers(100, 10_000) * (1 - rho), c_ar=rng.random() * 1e-6,
                             c_a2a=rng.random() * 1e-6)
        r_max = len(counts)
        best, evaluations = rl.choose_rows(loss, r_max)
        brute = int(np.argmin(loss[:r_max + 1]))
        # The curve is convex here (counts sorted): the search finds the brute-force optimum's value.
        assert loss[best] <= loss[brute] * (1 + 1e-12), (trial, best, brute)
        assert evaluations < max(200, r_max // 2), evaluations


def test_choose_hot_set_by_the_model_with_given_costs():
    layer = fr.FusedEmbedding(features("adagrad"), name="emb",
                              replication=fr.HotReplication(costs=(1e-7, 1e-6), sample_batches=5))
    reports = rl.choose_hot_set(layer, [batch(s) for s in range(5)])
    for g, report in enumerate(reports):
        assert report["chosen_by"] == "model" and report["sample_batches"] == 5
        # Independently: the unique pairs per batch outside the R most accessed, from the batches themselves.
        keys_per_batch = []
        for s in range(5):
            flats, _ = layer.flatten(batch(s))
            group = layer.groups[g]
            ids = [flats[n].ids for n in group.feature_names]
            segments = tf.repeat(tf.range(group.num_categories), [tf.size(i) for i in ids])
            keys_per_batch.append(unified_keys(tf.concat(ids, 0), segments, group.num_categories,
                                               group.encoding).numpy())
        keys, counts = np.unique(np.concatenate(keys_per_batch), return_counts=True)
        ranked = keys[np.lexsort((keys, -counts))]
        loss = [r * 1e-7 + np.mean([len(set(k.tolist()) - set(ranked[:r].tolist())) for k in keys_per_batch]) * 1e-6
                for r in range(len(ranked) + 1)]
        assert np.isclose(report["predicted_seconds"], min(loss)), (report, min(loss))
        assert report["model"] == "unique"
        assert len(layer.hot_sets[g]) == report["rows"] > 0


def test_one_worker_auto_replicates_nothing():
    layer = fr.FusedEmbedding(features("sgd"), replication="auto", name="emb")
    reports = rl.choose_hot_set(layer, [batch(0)])
    assert [r["rows"] for r in reports] == [0, 0] and all(len(s) == 0 for s in layer.hot_sets)
    layer(batch(1))  # an empty hot set works


def test_merge_counts_on_one_worker_sorts_by_count_then_key():
    counted = {"keys": np.array([5, 3, 9, 1]), "ids": np.array([5, 3, 9, 1]), "segments": np.zeros(4, np.int32),
               "counts": np.array([2, 7, 2, 1]), "presence": np.array([1, 2, 2, 1]), "accesses": 12, "batches": 2}
    merged = rl.merge_counts(counted, SingleProcessComm(), "x")
    assert merged["keys"].tolist() == [3, 5, 9, 1] and merged["counts"].tolist() == [7, 2, 2, 1]
    assert merged["accesses"] == 12 and merged["batches"] == 2 and merged["unique"] == 6
    assert merged["presence"].tolist() == [2, 1, 2, 1]
    np.testing.assert_allclose(rl.sent_curve(merged), [3, 2, 1.5, 0.5, 0])  # unique pairs per batch outside top R
    np.testing.assert_allclose(rl.sent_curve(merged, dedup=False), 6 * (1 - np.array([0, 7, 9, 11, 12]) / 12))
    assert rl.merge_counts(counted, SingleProcessComm(), "x", cap=2)["keys"].tolist() == [3, 5]


# --- re-peek ------------------------------------------------------------------------------------------------------

@pytest.mark.tfra
@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_move_hot_set_keeps_every_row_and_slot_and_training_goes_on(optimizer):
    plain = Trainer(optimizer)
    hot = Trainer(optimizer, fr.HotReplication(rows=5))
    rl.choose_hot_set(hot.layer, [batch(s) for s in range(3)])
    for s in range(3):
        plain.step(batch(s))
        hot.step(batch(s))
    before = hot.rows()
    reports = rl.repeek(hot.layer, [batch(s, seed=5) for s in range(3)], hot.optimizer)
    assert sum(r["left"] + r["entered"] for r in reports) > 0, reports
    assert_same(hot.rows(), before, "the rows after the move")
    for g in range(len(hot.layer.groups)):  # the replicated table holds hot keys only
        keys = hot.layer.hot_tables[g].params.export()[0].numpy()
        assert set(keys.tolist()) <= set(hot.layer.hot_sets[g].keys.numpy().tolist())
        cold = set(hot.layer.tables[g].params.export()[0].numpy().tolist())
        assert not cold & set(hot.layer.hot_sets[g].keys.numpy().tolist())
    for s in range(3, 6):
        np.testing.assert_allclose(hot.step(batch(s))[0], plain.step(batch(s))[0], rtol=RTOL)
    assert_same(hot.rows(), plain.rows(), "after the re-peek and 3 more steps")


# --- checkpoints --------------------------------------------------------------------------------------------------

@pytest.mark.tfra
def test_checkpoint_holds_the_hot_set_and_both_tables(tmp_path):
    comm = SingleProcessComm()

    def trainer():
        return Trainer("adam", fr.HotReplication(rows=5))

    reference = trainer()
    rl.choose_hot_set(reference.layer, [batch(s) for s in range(3)])
    for s in range(6):
        reference.step(batch(s))
    reference_rows = reference.rows()
    tf.keras.backend.clear_session()

    first = trainer()
    rl.choose_hot_set(first.layer, [batch(s) for s in range(3)])
    for s in range(3):
        first.step(batch(s))
    first.counter.assign(3)
    Checkpointer(str(tmp_path), first.model, first.optimizer, first.counter, comm).save()
    tf.keras.backend.clear_session()

    second = trainer()  # a fresh process would not have chosen yet: the hot set comes from the checkpoint
    restored = Checkpointer(str(tmp_path), second.model, second.optimizer, second.counter, comm).restore()
    assert restored["step"] == 3
    for g in range(2):
        np.testing.assert_array_equal(second.layer.hot_sets[g].keys.numpy(), first.layer.hot_sets[g].keys.numpy())
    for s in range(3, 6):
        second.step(batch(s))
    assert_same(second.rows(), reference_rows, "restored and continued")
    tf.keras.backend.clear_session()

    plain = Trainer("adam", name="hot")  # the same tables, without replication
    with pytest.raises(CheckpointError, match="replicated tables"):
        Checkpointer(str(tmp_path), plain.model, plain.optimizer, tf.Variable(0, dtype=tf.int64), comm).restore()


# --- errors -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"rows": -1}, "rows must be an integer >= 0"),
    ({"rows": 2.5}, "rows must be an integer"),
    ({"max_bytes": -5}, "max_bytes must be an integer >= 0"),
    ({"sample_batches": 0}, "sample_batches must be an integer >= 1"),
    ({"costs": (1.0,)}, "costs must be"),
])
def test_bad_hot_replication_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fr.HotReplication(**kwargs)


def test_what_cannot_be_replicated_is_refused_by_name():
    with pytest.raises(ValueError, match=r"replication \(rows\) must be >= 0"):
        fr.FusedEmbedding(features("sgd"), replication=-3, name="e1")
    with pytest.raises(ValueError, match="replication must be None, 'auto'"):
        fr.FusedEmbedding(features("sgd"), replication="hot", name="e2")
    with pytest.raises(ValueError, match=r"group .*\(a, b, tags\).*'ftrl'"):
        fr.FusedEmbedding(features("ftrl"), replication=4, name="e3")
    with pytest.raises(ValueError, match="needs the Hashed initializer"):
        fr.FusedEmbedding(features("sgd"), replication=4, initializer=tf.keras.initializers.Zeros(), name="e4")
    with pytest.raises(ValueError, match="fusion='deferred'"):
        fr.FusedEmbedding(features("sgd"), replication=4, fusion="source_hash", name="e5")
    with pytest.raises(ValueError, match=r"rows=1000 needs .* over max_bytes=1000"):
        fr.FusedEmbedding(features("sgd"), replication=fr.HotReplication(rows=1000, max_bytes=1000), name="e6")
    with pytest.raises(ValueError, match="built with replication"):
        rl.choose_hot_set(fr.FusedEmbedding(features("sgd"), name="e7"), [batch(0)])


def test_config_round_trip():
    layer = fr.FusedEmbedding(features("sgd"), replication=fr.HotReplication(rows=7, sample_batches=3), name="emb")
    config = layer.get_config()
    assert config["replication"]["rows"] == 7 and config["replication"]["sample_batches"] == 3
    tf.keras.backend.clear_session()
    again = fr.FusedEmbedding.from_config(config)
    assert again.replication == layer.replication
