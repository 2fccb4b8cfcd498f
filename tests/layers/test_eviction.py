"""Tables that evict (FusedEmbedding(eviction=fr.Eviction(...)), tf_fusedrec/distributed/eviction.py) on one worker.

* victims() against a NumPy sort on random statuses with ties, both policies, protected keys, capacity above the
  size, and protected keys alone over the capacity;
* a training run keeps exactly the rows a plain-Python simulation of the counts, recency and eviction rule keeps,
  after every step, LFU and LRU, eager and tf.function, float32 and float16 storage; optimizer slots leave with their
  rows; the keys of the step just trained are never evicted;
* an evicted id comes back with its initializer's row and fresh optimizer state (as an id never seen);
* bad capacities, policies, intervals and feature names are ValueErrors naming them.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec import initializers
from tf_fusedrec.distributed import eviction

VOCAB = 16


@pytest.fixture(autouse=True)
def _fresh_session():
    tf.keras.backend.clear_session()
    yield
    tf.keras.backend.clear_session()


# --- the choice -----------------------------------------------------------------------------------------------------

def numpy_victims(keys, counts, lasts, clock, capacity, policy):
    excess = max(len(keys) - capacity, 0)
    rows = [(c, l, k) if policy == "lfu" else (l, c, k) for k, c, l in zip(keys, counts, lasts) if l != clock]
    return [r[2] for r in sorted(rows)[:excess]]


@pytest.mark.parametrize("policy", ["lfu", "lru"])
@pytest.mark.parametrize("seed", range(8))
def test_victims_equal_numpy(policy, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 40))
    keys = rng.choice(2 ** 40, n, replace=False).astype(np.int64) - 2 ** 39  # negative keys too
    counts = rng.integers(1, 4, n).astype(np.int64)   # few values: ties
    clock = 10
    lasts = rng.integers(7, clock + 1, n).astype(np.int64)
    for capacity in (0, 1, n // 2, n, n + 3):
        got = eviction.victims(tf.constant(keys), tf.constant(counts), tf.constant(lasts), tf.constant(clock, tf.int64),
                               capacity, policy).numpy().tolist()
        assert got == numpy_victims(keys, counts, lasts, clock, capacity, policy), (capacity, policy)


def test_protected_keys_alone_over_capacity_are_kept():
    keys, counts = tf.constant([1, 2, 3], tf.int64), tf.constant([1, 1, 1], tf.int64)
    got = eviction.victims(keys, counts, tf.constant([5, 5, 4], tf.int64), tf.constant(5, tf.int64), 1, "lfu")
    assert got.numpy().tolist() == [3]


# --- training ---------------------------------------------------------------------------------------------------------

class Simulation:
    """The counts, recency and eviction rule of eviction.py, in plain Python, on ids (one feature, one table)."""

    def __init__(self, capacity, policy, interval):
        self.capacity, self.policy, self.interval = capacity, policy, interval
        self.held, self.status, self.clock, self.updates = set(), {}, 0, 0

    def step(self, ids):
        self.clock += 1
        for i in set(ids.tolist()):
            count = self.status.get(i, (0, 0))[0]
            self.status[i] = (count + 1, self.clock)
            self.held.add(i)
        self.updates += 1
        if self.updates % self.interval == 0:
            keys = sorted(self.held)
            gone = numpy_victims(keys, [self.status[k][0] for k in keys], [self.status[k][1] for k in keys],
                                 self.clock, self.capacity, self.policy)
            self.held -= set(gone)
            for k in gone:
                del self.status[k]
        return self.held


def make_layer(policy, storage="float32", capacity=5, interval=2, name="ev"):
    features = [fr.Feature("a", dim=4, max_id_bits=8, optimizer={"name": "adagrad", "learning_rate": 0.3})]
    layer = fr.FusedEmbedding(features, eviction=fr.Eviction(capacity=capacity, policy=policy, interval=interval),
                              storage=storage, name=name)
    optimizer = fr.train.make_optimizer(layer, default="sgd")

    def step(ids):
        with tf.GradientTape() as tape:
            out = layer({"a": ids}, training=True)["a"]
            loss = tf.reduce_sum(tf.square(out - 0.5))
        optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))
        return out

    return layer, optimizer, step


def held_ids(layer, optimizer):
    """Ids of the rows of the layer's table, checking the slots and the status hold the same keys."""
    sharded = layer.sharded_tables()[0]
    keys = sharded.params.export()[0].numpy()
    table = layer.tables[0]
    slot = optimizer.sparse_optimizer_of(table.shadow).get_slot(table.shadow, "accumulator").params
    assert sorted(slot.export()[0].numpy().tolist()) == sorted(keys.tolist()), "slots not evicted with their rows"
    assert sorted(table.status.export()[0].numpy().tolist()) == sorted(keys.tolist()), "status out of step"
    return set(sharded.ids_of_keys(keys).tolist())


@pytest.mark.parametrize("policy, storage, mode", [
    ("lfu", "float32", "function"), ("lru", "float32", "function"), ("lfu", "float16", "function"),
    ("lru", "float32", "eager")])
def test_training_keeps_what_the_simulation_keeps(policy, storage, mode):
    layer, optimizer, step = make_layer(policy, storage)
    step = tf.function(step) if mode == "function" else step
    sim = Simulation(capacity=5, policy=policy, interval=2)
    rng = np.random.default_rng(3)
    for s in range(12):
        ids = (rng.zipf(1.3, 4) % VOCAB).astype(np.int64)
        step(tf.constant(ids))
        want = sim.step(ids)
        assert held_ids(layer, optimizer) == want, f"step {s}"
        assert set(ids.tolist()) <= want, "a row of the step just trained was evicted"
    stats = layer.eviction_statistics()
    (group,) = stats
    assert stats[group]["capacity"] == 5 and stats[group]["evicted"] > 0 and stats[group]["rows"] == len(sim.held)


def test_one_step_over_capacity_keeps_its_rows():
    layer, optimizer, step = make_layer("lru", capacity=2, interval=1)
    step(tf.constant([1, 2, 3, 4, 5], tf.int64))
    assert held_ids(layer, optimizer) == {1, 2, 3, 4, 5}
    step(tf.constant([6], tf.int64))
    assert held_ids(layer, optimizer) == {6, 5}  # 5 was read in step 1 like the others: the larger key stays


def test_evicted_id_comes_back_as_new():
    layer, optimizer, step = make_layer("lru", capacity=1, interval=1, name="back")
    fresh, fresh_optimizer, fresh_step = make_layer("lru", capacity=100, interval=1, name="fresh")
    init = initializers.hashed_rows_numpy([7], [initializers.feature_salt(0, "a")], 4, 0.05)
    np.testing.assert_array_equal(step(tf.constant([7], tf.int64)).numpy(), init)
    step(tf.constant([8], tf.int64))  # 7 is evicted
    assert held_ids(layer, optimizer) == {8}
    np.testing.assert_array_equal(layer({"a": tf.constant([7], tf.int64)}, training=False)["a"].numpy(), init)
    # Read again, it trains like an id never seen: its row and accumulator start anew.
    np.testing.assert_array_equal(step(tf.constant([7], tf.int64)).numpy(), init)
    fresh_step(tf.constant([7], tf.int64))
    np.testing.assert_array_equal(layer({"a": tf.constant([7], tf.int64)}, training=False)["a"].numpy(),
                                  fresh({"a": tf.constant([7], tf.int64)}, training=False)["a"].numpy())


# --- errors -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"capacity": 0}, "capacity must be an integer >= 1"),
    ({"capacity": -3}, "capacity must be an integer >= 1"),
    ({"capacity": True}, "capacity must be an integer >= 1"),
    ({"capacity": 2.5}, "capacity must be an integer >= 1"),
    ({"capacity": {"a": 0}}, "capacity of feature 'a' must be an integer >= 1"),
    ({"capacity": 5, "policy": "fifo"}, "policy must be one of"),
    ({"capacity": 5, "interval": 0}, "interval must be an integer >= 1"),
])
def test_bad_eviction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fr.Eviction(**kwargs)


def test_capacity_of_unknown_or_conflicting_features():
    features = [fr.Feature("a", dim=4), fr.Feature("b", dim=4)]  # one group
    with pytest.raises(ValueError, match=r"names features the layer does not have: \['zz'\]"):
        fr.FusedEmbedding(features, eviction=fr.Eviction(capacity={"zz": 3}), name="e1")
    with pytest.raises(ValueError, match="share one table .* different capacities"):
        fr.FusedEmbedding(features, eviction=fr.Eviction(capacity={"a": 3, "b": 4}), name="e2")
    with pytest.raises(ValueError, match="eviction must be None or fr.Eviction"):
        fr.FusedEmbedding(features, eviction=5, name="e3")
    layer = fr.FusedEmbedding(features, eviction=fr.Eviction(capacity={"a": 3}), name="e4")
    assert layer.tables[0].status is not None
