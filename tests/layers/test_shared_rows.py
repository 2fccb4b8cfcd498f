"""Features that share rows (fr.Feature(..., shares="items")) against an unfused model written in plain TensorFlow.

The reference holds one dense tf.Variable per table (the items' rows serve items, target and clicked; user and age
have their own), initialised with the documented Hashed rows of (feature, id) (tests/layers/reference.py), looked up
with tf.gather / tf.nn.safe_embedding_lookup_sparse and trained by Keras' Adagrad: nothing of tf_fusedrec's lookup.

* FusedEmbedding equals it in outputs, losses and rows over a few Adagrad steps (the gradients of every feature that
  reads a row land on that row, summed before the update), eagerly and in a tf.function, TFRA and native tables,
  packed and hashed keys, with hot-row replication, and to float16 rounding with float16 storage; held-out outputs
  (training=False) read the trained rows; statistics count a shared pair once;
* two workers (threads of this process over an in-process comm, each with half of every batch) equal it too, each
  row on its owner only;
* PerFeatureEmbedding with one TFRA table for the features that share it equals it too;
* every refused `shares` (another dim, optimizer, initializer or key dtype; a missing feature; itself; a chain) is a
  ValueError naming both features, in the layers and in the YAML configs;
* get_config / from_config and the YAML configs keep `shares`; an Eviction capacity named by either feature bounds
  their table;
* a checkpoint restores onto 1 worker and onto 2 (each rank keeps the rows it owns); an export names the shared
  category, and the served model predicts the training model's scores.
"""

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tests.layers import reference as ref
from tf_fusedrec import config as cfg
from tf_fusedrec.distributed import replication as rl
from tf_fusedrec.distributed.comm import Comm, SingleProcessComm
from tf_fusedrec.ops import reference as ops_reference
from tf_fusedrec.train.checkpoint import Checkpointer

VOCAB = 12  # ids in [0, VOCAB): the features collide on purpose
BATCH = 6
STEPS = 3
OPTIMIZER = {"name": "adagrad", "learning_rate": 0.2}
RTOL, ATOL = 1e-5, 1e-6
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def make_features(max_id_bits=None):
    features = [
        fr.Feature("items", dim=4),  # the history: ragged, one row per item
        fr.Feature("target", dim=4, shares="items"),  # one id per example, the items' rows
        fr.Feature("clicked", dim=4, combiner="mean", shares="items"),  # [B, 3] padded: its own combiner
        fr.Feature("user", dim=4),  # the same spec, but its own category: never the items' rows
        fr.Feature("age", dim=2, combiner="sum"),  # another group
    ]
    return [dataclasses.replace(f, max_id_bits=max_id_bits) for f in features]


def make_batch(step):
    """(inputs, weights): a batch and the fixed upstream weights of the loss, shaped like each output."""
    rng = np.random.default_rng([11, step])
    lengths = rng.integers(0, 4, BATCH)
    lengths[step % BATCH] = 0  # an empty history
    clicked = rng.integers(0, VOCAB, (BATCH, 3))
    clicked[rng.random((BATCH, 3)) < 0.3] = -1
    age = rng.integers(0, VOCAB, (BATCH, 2))
    age[rng.random((BATCH, 2)) < 0.3] = -1
    inputs = {
        "items": tf.RaggedTensor.from_row_lengths(tf.constant(rng.integers(0, VOCAB, int(lengths.sum())), tf.int64),
                                                  tf.constant(lengths, tf.int64)),
        "target": tf.constant(rng.integers(0, VOCAB, BATCH), tf.int64),
        "clicked": tf.constant(clicked, tf.int64),
        "user": tf.constant(rng.integers(0, VOCAB, BATCH), tf.int64),
        "age": tf.constant(age, tf.int64),
    }
    dims = {"items": 4, "target": 4, "clicked": 4, "user": 4, "age": 2}
    weights = {n: tf.constant(rng.normal(size=(int(lengths.sum()) if n == "items" else BATCH, d)), tf.float32)
               for n, d in dims.items()}
    return inputs, weights


def loss_of(outputs, weights):
    """A loss whose gradient depends on the rows: sum over features of tanh(output) * W."""
    total = 0.0
    for name, w in weights.items():
        out = outputs[name]
        out = out.flat_values if isinstance(out, tf.RaggedTensor) else out
        total += tf.reduce_sum(tf.tanh(out) * w)
    return total


def valid(ids):
    values = ids.flat_values if isinstance(ids, tf.RaggedTensor) else tf.reshape(ids, [-1])
    values = values.numpy()
    return values[values >= 0]


class Unfused:
    """The independent reference: one dense tf.Variable per table, plain TF lookups, Keras' Adagrad."""

    def __init__(self, features):
        self.features = features
        self.tables = {f.name: tf.Variable(ref.initial_rows(f.name, np.arange(VOCAB), f.dim), name=f.name)
                       for f in features if f.shares is None}
        self.optimizer = tf.keras.optimizers.legacy.Adagrad(learning_rate=OPTIMIZER["learning_rate"])

    def __call__(self, inputs):
        out = {}
        for f in self.features:
            table, ids = self.tables[f.shares or f.name], inputs[f.name]
            if isinstance(ids, tf.RaggedTensor):
                out[f.name] = ids.with_flat_values(tf.gather(table, ids.flat_values))
            elif f.combiner is None:
                out[f.name] = tf.gather(table, ids)
            else:
                sparse = tf.sparse.from_dense(ids + 1)  # from_dense drops zeros: shift the -1 padding to 0
                sparse = tf.SparseTensor(sparse.indices, sparse.values - 1, sparse.dense_shape)
                out[f.name] = tf.nn.safe_embedding_lookup_sparse(table, sparse, combiner=f.combiner)
        return out

    def step(self, inputs, weights):
        with tf.GradientTape() as tape:
            out = self(inputs)
            loss = loss_of(out, weights)
        variables = list(self.tables.values())
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss, out


def layer_step(layer, optimizer, mode, scale=1.0):
    """scale: N workers each scale their loss by N, so the averaged gradients are those of the whole batch."""

    def step(inputs, weights):
        with tf.GradientTape() as tape:
            out = layer(inputs, training=True)
            loss = loss_of(out, weights) * scale
        variables = layer.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss, out

    if mode == "eager":
        return step
    inputs, weights = make_batch(0)
    # autograph=False: nothing here branches on tensors, and tracing takes about half the time.
    return tf.function(step, autograph=False, input_signature=[{k: ref.spec_of(v) for k, v in inputs.items()},
                                              {k: ref.spec_of(v) for k, v in weights.items()}])


def assert_outputs_close(got, want, what):
    assert sorted(got) == sorted(want), what
    for name in want:
        g, w = got[name], want[name]
        if isinstance(w, tf.RaggedTensor):
            assert isinstance(g, tf.RaggedTensor), f"{what}: {name} is not ragged"
            np.testing.assert_array_equal(g.row_splits.numpy(), w.row_splits.numpy())
            g, w = g.flat_values, w.flat_values
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=RTOL, atol=ATOL, err_msg=f"{what}: {name}")


def touched(batches, features):
    """{table owner: sorted ids some feature reading its rows looked up}."""
    out = {f.name: set() for f in features if f.shares is None}
    for inputs, _ in batches:
        for f in features:
            out[f.shares or f.name].update(valid(inputs[f.name]).tolist())
    return {k: np.array(sorted(v), np.int64) for k, v in out.items()}


def fused_rows(layer, owner, ids):
    """(rows, exists) the FusedEmbedding's table holds for (owner's category, id)."""
    g, group = next((i, g) for i, g in enumerate(layer.groups) if owner in g.feature_names)
    keys = ref.unified_keys(ids, group.category_of(owner), group.num_categories, group.encoding)
    values, exists = layer.tables[g].rows.lookup(tf.constant(keys, tf.int64), return_exists=True)
    return values.numpy(), exists.numpy()


# --------------------------------------------------------------------------------------------------------------
# Equality with the unfused model
# --------------------------------------------------------------------------------------------------------------

CASES = [  # (table_backend, mode, encoding, replication)
    ("tfra", "eager", "packed", None),
    ("tfra", "function", "hashed", None),
    ("native", "eager", "hashed", None),
    ("native", "function", "packed", None),
    ("native", "eager", "packed", 5),
]


@pytest.mark.keras2
@pytest.mark.parametrize("backend, mode, encoding, replication", CASES,
                         ids=["-".join(str(x) for x in c if x is not None) for c in CASES])
def test_fused_equals_the_unfused_model(backend, mode, encoding, replication):
    features = make_features(max_id_bits=8 if encoding == "packed" else None)
    layer = fr.FusedEmbedding(features, optimizer=OPTIMIZER, table_backend=backend, name=f"shared_{backend}",
                              replication=None if replication is None else fr.HotReplication(rows=replication))
    group = layer.groups[1]
    assert [g.encoding for g in layer.groups] == [encoding] * 2
    assert group.feature_names == ("clicked", "items", "target", "user")
    assert group.categories == ("items", "user") and group.num_categories == 2
    assert group.shares == (("clicked", "items"), ("target", "items"))
    assert [group.category_of(n) for n in group.feature_names] == [0, 0, 0, 1]
    batches = [make_batch(s) for s in range(STEPS)]
    if replication is not None:
        rl.choose_hot_set(layer, [inputs for inputs, _ in batches])
        assert len(layer.hot_sets[1]) == replication
    reference = Unfused(features)
    step = layer_step(layer, fr.train.make_optimizer(layer, default="sgd"), mode)

    for s, (inputs, weights) in enumerate(batches):
        want_loss, want = reference.step(inputs, weights)
        got_loss, got = step(inputs, weights)
        np.testing.assert_allclose(got_loss.numpy(), want_loss.numpy(), rtol=RTOL, err_msg=f"loss at step {s}")
        assert_outputs_close(got, want, f"outputs at step {s}")

    # Rows: the touched ids of each table, trained as the reference trained them; nothing else is held.
    rows_held = 0
    for owner, ids in touched(batches, features).items():
        if replication is None:
            rows, exists = fused_rows(layer, owner, ids)
            assert exists.all(), f"{owner}: touched ids missing from the table"
            np.testing.assert_allclose(rows, reference.tables[owner].numpy()[ids], rtol=RTOL, atol=ATOL,
                                       err_msg=f"{owner}: trained rows")
        rows_held += len(ids)
    assert sum(int(t.size()) for t in layer.tables + layer.hot_tables) >= rows_held
    if replication is None:
        assert sum(int(t.size()) for t in layer.tables) == rows_held

    # Inference reads the trained rows.
    held_out, _ = make_batch(100)
    assert_outputs_close(layer(held_out, training=False), reference(held_out), "held-out outputs")

    stats = {n: {k: int(v) for k, v in d.items()} for n, d in layer.statistics().items()}  # of the last call
    inputs = held_out
    shared = np.concatenate([valid(inputs[n]) for n in ("items", "target", "clicked")])
    for name in ("items", "target", "clicked", "user", "age"):
        assert stats[name]["ids"] == valid(inputs[name]).size, name
    if replication is None:
        # One worker: a pair is sent and looked up once, counted under the feature that owns the rows.
        assert stats["items"]["unique_looked_up"] == np.unique(shared).size
        assert stats["target"]["unique_looked_up"] == stats["clicked"]["unique_looked_up"] == 0
        assert stats["user"]["unique_looked_up"] == np.unique(valid(inputs["user"])).size
    else:
        # hot_hits: each feature's ids whose pair (the category it reads, id) is hot.
        _, hot_ids, hot_segments = layer.hot_sets[1].numpy()
        hot = set(zip(hot_segments.tolist(), hot_ids.tolist()))
        for name in group.feature_names:
            want = sum((group.category_of(name), int(i)) in hot for i in valid(inputs[name]))
            assert stats[name]["hot_hits"] == want, name
        assert sum(stats[n]["hot_hits"] for n in group.feature_names) > 0


@pytest.mark.keras2
def test_float16_storage_keeps_one_row_for_both_features():
    """storage="float16": the shared rows are stored float16 values, the reference's to float16 rounding."""
    features = make_features()
    layer = fr.FusedEmbedding(features, optimizer=OPTIMIZER, storage="float16", name="half")
    step = layer_step(layer, fr.train.make_optimizer(layer, default="sgd"), "eager")
    reference = Unfused(features)
    batches = [make_batch(s) for s in range(STEPS)]
    for inputs, weights in batches:
        reference.step(inputs, weights)
        step(inputs, weights)
    for owner, ids in touched(batches, features).items():
        rows, exists = fused_rows(layer, owner, ids)
        assert exists.all() and sum(int(t.size()) for t in layer.tables) >= len(ids), owner
        np.testing.assert_array_equal(rows.astype(np.float16).astype(np.float32), rows, err_msg=owner)
        np.testing.assert_allclose(rows, reference.tables[owner].numpy()[ids], rtol=2e-2, atol=2e-3, err_msg=owner)


class ThreadHub:
    """Where the simulated workers (threads of this process) meet: their n-th collectives exchange arrays."""

    def __init__(self, size):
        self.size, self.boxes, self.cond = size, {}, threading.Condition()

    def exchange(self, rank, seq, kind, parts):
        """parts[d]: what `rank` sends to rank d -> what each rank sent to `rank`, in rank order."""
        with self.cond:
            for d, part in enumerate(parts):
                self.boxes[(seq, rank, d)] = (kind, part)
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: all((seq, s, rank) in self.boxes for s in range(self.size)), 60):
                raise TimeoutError(f"rank {rank}: collective {seq} ({kind}) was never joined")
            got = [self.boxes.pop((seq, s, rank)) for s in range(self.size)]
        assert all(k == kind for k, _ in got), f"collective {seq}: ranks disagree on its kind {got}"
        return [part for _, part in got]


class ThreadComm(Comm):
    """Rank `rank` of a ThreadHub's workers (eager only): collectives are matched by their order, and the embeddings
    all-to-all sends its gradient back as Horovod's does."""

    def __init__(self, rank, hub):
        self.rank, self.size, self.hub, self.seq = rank, hub.size, hub, 0

    def _exchange(self, kind, parts):
        self.seq += 1
        return self.hub.exchange(self.rank, self.seq, kind, parts)

    def _alltoall(self, tensor, splits):
        got = self._exchange("alltoall", np.split(tensor.numpy(), np.cumsum(splits.numpy())[:-1]))
        return tf.constant(np.concatenate(got)), tf.constant([len(g) for g in got], tf.int32)

    def alltoall(self, tensor, splits, name):  # noqa: ARG002
        if not tensor.dtype.is_floating:
            return self._alltoall(tensor, splits)
        received_splits = []

        @tf.custom_gradient
        def exchange(x):
            received, back = self._alltoall(x, splits)
            received_splits.append(back)
            return received, lambda upstream: self._alltoall(tf.convert_to_tensor(upstream), back)[0]

        received = exchange(tensor)
        return received, received_splits[0]

    def allreduce(self, tensors, name, op="average"):  # noqa: ARG002
        got = self._exchange("allreduce", [[t.numpy() for t in tensors]] * self.size)
        total = [sum(values) for values in zip(*got)]
        return [tf.constant(t / self.size if op == "average" else t) for t in total]

    def allgather(self, tensor, name):  # noqa: ARG002
        return tf.constant(np.concatenate(self._exchange("allgather", [tensor.numpy()] * self.size)))


def local_slice(inputs, weights, rank, size):
    lo, hi = rank * BATCH // size, (rank + 1) * BATCH // size
    splits = inputs["items"].row_splits.numpy()
    local_weights = {n: w[splits[lo]:splits[hi]] if n == "items" else w[lo:hi] for n, w in weights.items()}
    return {n: x[lo:hi] for n, x in inputs.items()}, local_weights


@pytest.mark.keras2
@pytest.mark.parametrize("backend, encoding", [("tfra", "hashed"), ("native", "packed")])
def test_two_workers_equal_the_unfused_model(backend, encoding):
    """Two workers (threads over a ThreadHub, each with its half of every batch) train the rows one unfused model
    trains on the whole batch; with several workers the sender deduplicates the shared category's pairs before the
    keys all-to-all, and each row lives on owner_of(id) only."""
    features = make_features(max_id_bits=8 if encoding == "packed" else None)
    hub = ThreadHub(2)
    layers = [fr.FusedEmbedding(features, optimizer=OPTIMIZER, comm=ThreadComm(r, hub), table_backend=backend,
                                name=f"worker{r}") for r in range(2)]
    steps = [layer_step(layer, fr.train.make_optimizer(layer, default="sgd"), "eager", scale=2.0)
             for layer in layers]
    batches = [make_batch(s) for s in range(STEPS)]
    results, errors = [[], []], []

    def work(rank):
        try:
            for inputs, weights in batches:
                results[rank].append(steps[rank](*local_slice(inputs, weights, rank, 2))[1])
        except Exception as e:  # noqa: BLE001  (re-raised below, on the test's thread)
            errors.append(e)
            hub.size = -1  # the peer's wait fails fast instead of timing out

    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    reference = Unfused(features)
    for s, (inputs, weights) in enumerate(batches):
        _, want = reference.step(inputs, weights)
        got = {n: tf.concat([results[r][s][n] for r in range(2)], axis=0) for n in want}
        assert_outputs_close(got, want, f"outputs at step {s}, ranks 0 and 1 concatenated")
    for owner, ids in touched(batches, features).items():
        union = {}
        for rank, layer in enumerate(layers):
            rows, exists = fused_rows(layer, owner, ids)
            assert (ops_reference.owner_of(ids[exists], 2) == rank).all(), f"{owner}: rank {rank} holds others' rows"
            union.update({int(i): r for i, r in zip(ids[exists], rows[exists])})
        assert sorted(union) == ids.tolist(), owner
        np.testing.assert_allclose(np.stack([union[int(i)] for i in ids]), reference.tables[owner].numpy()[ids],
                                   rtol=RTOL, atol=ATOL, err_msg=f"{owner}: rows of 2 workers")


def test_per_feature_embedding_shares_one_table():
    features = make_features()
    layer = fr.PerFeatureEmbedding(features, optimizer=OPTIMIZER, name="shared_per_feature")
    assert len(layer.sharded_tables()) == 3  # items (with target and clicked), user, age
    assert layer.tfra_layer("target") is layer.tfra_layer("items") is layer.tfra_layer("clicked")
    assert [(g.feature_names, g.shares) for g in layer.groups] == [
        (("age",), ()), (("clicked", "items", "target"), (("clicked", "items"), ("target", "items"))), (("user",), ())]
    reference = Unfused(features)
    step = layer_step(layer, fr.train.make_optimizer(layer, default="sgd"), "function")
    batches = [make_batch(s) for s in range(STEPS)]
    for s, (inputs, weights) in enumerate(batches):
        want_loss, want = reference.step(inputs, weights)
        got_loss, got = step(inputs, weights)
        np.testing.assert_allclose(got_loss.numpy(), want_loss.numpy(), rtol=RTOL, err_msg=f"loss at step {s}")
        assert_outputs_close(got, want, f"outputs at step {s}")
    for owner, ids in touched(batches, features).items():
        rows, exists = layer.tfra_layer(owner).params.lookup(tf.constant(ids), return_exists=True)
        assert exists.numpy().all()
        assert int(layer.tfra_layer(owner).params.size()) == len(ids), owner
        np.testing.assert_allclose(rows.numpy(), reference.tables[owner].numpy()[ids], rtol=RTOL, atol=ATOL,
                                   err_msg=owner)
    held_out, _ = make_batch(100)
    assert_outputs_close(layer(held_out, training=False), reference(held_out), "held-out outputs")


# --------------------------------------------------------------------------------------------------------------
# Refusals, each naming both features
# --------------------------------------------------------------------------------------------------------------

ITEMS = fr.Feature("items", dim=4)
REFUSED = [
    ([ITEMS, fr.Feature("target", dim=8, shares="items")], "dim differs"),
    ([ITEMS, fr.Feature("target", dim=4, optimizer="sgd", shares="items")], "optimizer differs"),
    ([ITEMS, fr.Feature("target", dim=4, initializer=fr.initializers.Constant(0.1), shares="items")],
     "initializer differs"),
    ([ITEMS, fr.Feature("target", dim=4, key_dtype=tf.int32, shares="items")], "key_dtype differs"),
    ([ITEMS, fr.Feature("target", dim=4, shares="itemz")], "does not exist"),
    ([fr.Feature("items", dim=4, shares="history"), fr.Feature("history", dim=4),
      fr.Feature("target", dim=4, shares="items")], "itself shares the rows of feature 'history'"),
]


def both(message, a="target", b="items"):
    return f"feature '{a}' shares the rows of feature '{b}'.*{message}"


@pytest.mark.parametrize("layer_cls", [fr.FusedEmbedding, fr.PerFeatureEmbedding])
@pytest.mark.parametrize("features, message", REFUSED, ids=[m.split()[0] for _, m in REFUSED])
def test_refused_shares_name_both_features(layer_cls, features, message):
    shared = next(f.shares for f in features if f.name == "target")
    with pytest.raises(ValueError, match=f"^bad: {both(message, 'target', shared)}"):
        layer_cls(features, name="bad")


def test_a_feature_cannot_share_itself():
    with pytest.raises(ValueError, match=both("itself", "target", "target")):
        fr.Feature("target", dim=4, shares="target")
    with pytest.raises(ValueError, match="feature 'target': shares must be None or the name of another feature"):
        fr.Feature("target", dim=4, shares="")


def test_sharing_is_declared_never_implied():
    """Two features of one spec stay two categories unless one declares shares."""
    layer = fr.FusedEmbedding([fr.Feature("items", dim=4), fr.Feature("target", dim=4)], name="apart")
    (group,) = layer.groups
    assert group.categories == group.feature_names == ("items", "target") and group.shares == ()
    out = layer({"items": tf.constant([3], tf.int64), "target": tf.constant([3], tf.int64)})
    assert not np.allclose(out["items"].numpy(), out["target"].numpy())


# --------------------------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layer_cls", [fr.FusedEmbedding, fr.PerFeatureEmbedding])
def test_get_config_round_trip(layer_cls):
    layer = layer_cls(make_features(), optimizer=OPTIMIZER, name="round_trip")
    config = layer.get_config()
    assert {f["name"]: f["shares"] for f in config["features"]} == {
        "items": None, "target": "items", "clicked": "items", "user": None, "age": None}
    tf.keras.backend.clear_session()
    clone = layer_cls.from_config(config)
    assert clone.features == layer.features
    assert [(g.feature_names, g.shares, g.categories) for g in clone.groups] == [
        (g.feature_names, g.shares, g.categories) for g in layer.groups]
    assert cfg.Feature.from_config(make_features()[1].get_config()) == make_features()[1]


def raw_config(features):
    return {"name": "shares", "data": {"source": "synthetic", "num_dense": 0},
            "feature_defaults": {"optimizer": {"name": "adagrad", "learning_rate": 0.05}}, "features": features}


def test_yaml_shares():
    config = cfg.parse_config(raw_config([{"name": "items", "dim": 8, "hotness": [0, 4]},
                                          {"name": "target", "dim": 8, "shares": "items"}]))
    target = config.embedding_features()[1]
    assert target.shares == "items" and target.combiner is None
    layer = fr.FusedEmbedding(config.embedding_features(), optimizer=config.train.sparse_optimizer, name="from_yaml")
    assert layer.groups[0].shares == (("target", "items"),)


@pytest.mark.parametrize("target, message", [
    ({"name": "target", "dim": 16, "shares": "items"}, both("dim differs")),
    ({"name": "target", "dim": 8, "optimizer": "sgd", "shares": "items"}, both("optimizer differs")),
    ({"name": "target", "dim": 8, "shares": "movies"}, both("does not exist", "target", "movies")),
    ({"name": "target", "dim": 8, "shares": "target"}, both("itself", "target", "target")),
])
def test_yaml_refusals_name_both_features(target, message):
    with pytest.raises(ValueError, match=message):
        cfg.parse_config(raw_config([{"name": "items", "dim": 8}, target]))


def test_shipped_sequence_configs_share_the_item_rows():
    for name in ("movielens1m_seq", "grm_synthetic"):
        config = cfg.load_config(CONFIGS / f"{name}.yaml")
        assert {f.name: f.shares for f in config.features}["target"] == config.data.sequences.feature == "items"
        groups, _ = cfg.group_features(config.embedding_features(), cfg.optimizer_spec("adagrad"),
                                       cfg.default_initializer())
        (items,) = [g for g in groups if "items" in g.feature_names]
        assert items.categories == ("items",) and items.shares == (("target", "items"),), name


def test_eviction_capacity_named_by_a_sharing_feature_bounds_the_table():
    layer = fr.FusedEmbedding(make_features(), eviction=fr.Eviction(capacity={"target": 7}), name="bounded")
    assert layer._capacities == [None, 7]  # noqa: SLF001  (age's group, then the shared table)


# --------------------------------------------------------------------------------------------------------------
# Checkpoints and export
# --------------------------------------------------------------------------------------------------------------

class Holder(tf.Module):
    def __init__(self, layer):
        super().__init__()
        self.emb = layer


class RankOfTwo(SingleProcessComm):
    """Rank `rank` of 2 as the checkpoint restore sees it (every collective it issues is the identity here)."""

    size = 2

    def __init__(self, rank):
        self.rank = rank


def trainer(backend):
    layer = fr.FusedEmbedding(make_features(max_id_bits=8), optimizer=OPTIMIZER, table_backend=backend, name="ck")
    optimizer = fr.train.make_optimizer(layer, default="sgd")
    return layer, optimizer, layer_step(layer, optimizer, "eager"), tf.Variable(0, dtype=tf.int64)


def all_rows(layer, features):
    out = {}
    for owner in (f.name for f in features if f.shares is None):
        ids = np.arange(VOCAB, dtype=np.int64)
        rows, exists = fused_rows(layer, owner, ids)
        out.update({(owner, int(i)): r for i, r, e in zip(ids, rows, exists) if e})
    return out


@pytest.mark.parametrize("backend", ["native", "tfra"])
def test_checkpoint_restores_onto_one_and_two_workers(tmp_path, backend):
    features = make_features(max_id_bits=8)
    layer, optimizer, step, counter = trainer(backend)
    for s in range(2):
        step(*make_batch(s))
    counter.assign(2)
    Checkpointer(str(tmp_path), Holder(layer), optimizer, counter, SingleProcessComm()).save()
    saved = all_rows(layer, features)
    next_loss = float(step(*make_batch(2))[0])
    assert len(saved) == sum(len(ids) for ids in touched([make_batch(s) for s in range(2)], features).values())

    tf.keras.backend.clear_session()
    layer, optimizer, step, counter = trainer(backend)
    assert Checkpointer(str(tmp_path), Holder(layer), optimizer, counter, SingleProcessComm()).restore()["step"] == 2
    restored = all_rows(layer, features)
    assert sorted(restored) == sorted(saved)
    for key, row in saved.items():
        np.testing.assert_allclose(restored[key], row, rtol=RTOL, atol=ATOL, err_msg=str(key))
    np.testing.assert_allclose(float(step(*make_batch(2))[0]), next_loss, rtol=RTOL)

    # Onto 2 workers: each rank keeps the rows of the ids it owns (packed keys give the ids back).
    union = {}
    for rank in range(2):
        tf.keras.backend.clear_session()
        layer, optimizer, _, counter = trainer(backend)
        Checkpointer(str(tmp_path), Holder(layer), optimizer, counter, RankOfTwo(rank)).restore()
        mine = all_rows(layer, features)
        owners = ops_reference.owner_of(np.array([i for _, i in mine], np.int64), 2)
        assert (owners == rank).all(), f"rank {rank} restored rows it does not own"
        union.update(mine)
    assert sorted(union) == sorted(saved)


class Scorer(tf.keras.Model):
    def __init__(self, layer):
        super().__init__()
        self.emb = layer
        self.dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=3))

    def call(self, inputs, training=None):
        out = self.emb(inputs, training=training)
        x = tf.concat([tf.reduce_sum(out["items"], axis=1), out["target"], out["clicked"], out["user"], out["age"]], 1)
        return self.dense(x)[:, 0]


@pytest.mark.parametrize("layer_cls", [fr.FusedEmbedding, fr.PerFeatureEmbedding])
def test_export_serves_the_shared_rows(tmp_path, layer_cls):
    model = Scorer(layer_cls(make_features(), optimizer=OPTIMIZER, name="exported", comm="single"))
    optimizer = fr.train.make_optimizer(model, default="sgd")
    for s in range(2):
        inputs, _ = make_batch(s)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(inputs, training=True)))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    example, _ = make_batch(100)
    manifest = fr.export.export_model(model, str(tmp_path / "export"), example=example, parts=2)
    entries = {f["name"]: f for f in manifest["features"]}
    groups = {g["name"]: g for g in manifest["groups"]}
    for name in ("target", "clicked"):
        assert entries[name]["shares"] == "items"
        assert (entries[name]["group"], entries[name]["category"]) == (entries["items"]["group"],
                                                                       entries["items"]["category"])
    assert entries["items"]["shares"] is None
    shared_group = groups[entries["items"]["group"]]
    assert "target" not in shared_group["features"] and "clicked" not in shared_group["features"]
    assert len(shared_group["salts"]) == len(shared_group["features"])
    want = model(example, training=False).numpy()
    served = fr.export.load_model(str(tmp_path / "export"))
    for pooling in (True, False):  # clicked (a bag) pooled by the backend, or fetched row by row
        served.pooling = pooling
        np.testing.assert_allclose(served.predict(example), want, rtol=1e-5, atol=1e-6,
                                   err_msg=f"served scores, pooling={pooling}")
    served.close()
