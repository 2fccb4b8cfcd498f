"""FusedEmbedding(tier=fr.Tiered(...)) on one worker, against the same layer with every row in DRAM: with a cache far
smaller than the tables, a training run gives the same outputs, losses and tables (rows and slots, bit for bit) with
shared rows, float16 storage, eviction, admission and expiry; the changes a publish reads are the same; held-out
lookups (training=False) are the same; tier_statistics() reports the tiers; and a tier on TFRA tables or a bad tier
is refused naming the layer."""

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec.distributed.comm import SingleProcessComm
from tf_fusedrec.ops import native_table_ops

VOCAB = 5_000
BATCH = 96


def features():
    return [fr.Feature("user", dim=8, optimizer={"name": "adam", "learning_rate": 0.02}),
            fr.Feature("item", dim=8, optimizer={"name": "adam", "learning_rate": 0.02}),
            fr.Feature("clicked", dim=8, combiner="mean", shares="item",
                       optimizer={"name": "adam", "learning_rate": 0.02}),
            fr.Feature("tag", dim=4, combiner="sum", optimizer={"name": "adagrad", "learning_rate": 0.1})]


def batch(step):
    rng = np.random.default_rng([3, step])
    ids = lambda shape: ((rng.zipf(1.2, shape) * 131) % VOCAB).astype(np.int64)  # noqa: E731
    clicked = ids((BATCH, 3))
    clicked[rng.random((BATCH, 3)) < 0.3] = -1
    return {"user": ids(BATCH), "item": ids(BATCH), "clicked": clicked, "tag": ids((BATCH, 2))}, \
        rng.random(BATCH).astype(np.float32)


class Model(tf.keras.Model):
    def __init__(self, layer):
        super().__init__()
        self.embedding = layer
        self.dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1))

    def call(self, inputs, training=None):
        out = self.embedding(inputs, training=training)
        return self.dense(tf.concat([out[k] for k in ("user", "item", "clicked", "tag")], 1))


def build(name, tier, **options):
    layer = fr.FusedEmbedding(features(), name=name, comm=SingleProcessComm(), tier=tier, **options)
    model = Model(layer)
    model(batch(0)[0], training=False)  # builds the dense layer (no row is inserted without training)
    return layer, model


def train(layer, model, steps, graph):
    opt = fr.train.make_optimizer(model, default={"name": "sgd", "learning_rate": 0.05})

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True)[:, 0] - y))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    run = tf.function(step) if graph else step
    return [float(run(*batch(s))) for s in range(steps)]


def tables(layer):
    out = []
    for table in layer.tables:
        keys, rows, slots = (x.numpy() for x in native_table_ops.native_table_export(table.resource))
        order = np.argsort(keys)
        out.append((keys[order], rows[order], slots[order]))
    return out


def cache_bytes(slots, dim, storage="float32", capacity=512):
    """A cache of `capacity` slots (384 rows) of a table of `dim` with `slots` optimizer slots."""
    return capacity * (8 + dim * (2 if storage == "float16" else 4) + slots * dim * 4 + 16) + capacity // 4 + 64


POLICIES = {
    "plain": {},
    "float16": {"storage": "float16", "rounding": "stochastic"},
    "eviction": {"eviction": fr.Eviction(capacity=900, policy="lru", interval=3)},
    "admission_expiry": {"admission": fr.Admission(2), "expiry": fr.Expiry(10, interval=2)},
}


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_tiered_layer_trains_as_the_all_dram_layer(tmp_path, policy, graph):
    options = POLICIES[policy]
    storage = options.get("storage", "float32")
    # One budget for both groups: 384 rows of the adam group (the larger entries), more of the adagrad one's.
    tier = fr.Tiered(cache_bytes(2, 8, storage), str(tmp_path / "stores"))
    dram_layer, dram_model = build(f"dram_{policy}", None, **options)
    tiered_layer, tiered_model = build(f"tiered_{policy}", tier, **options)
    for layer in (dram_layer, tiered_layer):
        for table in layer.tables:
            table.clear_changes()
    losses = train(dram_layer, dram_model, 24, graph), train(tiered_layer, tiered_model, 24, graph)
    assert losses[0] == losses[1]
    for (ka, ra, sa), (kb, rb, sb) in zip(tables(dram_layer), tables(tiered_layer)):
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(ra, rb)
        np.testing.assert_array_equal(sa, sb)
    for a, b in zip(dram_layer.tables, tiered_layer.tables):
        (ka, ra, removed_a), (kb, rb, removed_b) = a.changes(), b.changes()
        oa, ob = np.argsort(ka), np.argsort(kb)
        np.testing.assert_array_equal(ka[oa], kb[ob])
        np.testing.assert_array_equal(ra[oa], rb[ob])
        np.testing.assert_array_equal(removed_a, removed_b)
    held_out, _ = batch(1000)
    np.testing.assert_array_equal(dram_model(held_out, training=False).numpy(),
                                  tiered_model(held_out, training=False).numpy())
    stats = tiered_layer.tier_statistics()
    assert set(stats) == {g.name for g in tiered_layer.groups}
    big = max(stats.values(), key=lambda s: s["disk_rows"])
    assert big["disk_rows"] > 0 and big["evicted_rows"] > 0 and 0 < big["hit_rate"] < 1, stats
    if policy == "plain":  # the table far larger than its cache
        assert big["disk_rows"] > 2 * big["dram_rows"], stats
    assert all(s["dram_capacity_rows"] == -1 for s in dram_layer.tier_statistics().values())
    assert tiered_layer.get_config()["tier"] == {"dram_bytes": tier.dram_bytes, "path": tier.path}


def test_tier_refusals(tmp_path):
    with pytest.raises(ValueError, match="needs table_backend='native'"):
        fr.FusedEmbedding(features(), name="tfra_tier", table_backend="tfra",
                          tier=fr.Tiered(1 << 20, str(tmp_path)))
    with pytest.raises(ValueError, match="bad_tier: tier takes dram_bytes and path"):
        fr.FusedEmbedding(features(), name="bad_tier", tier={"dram_bytes": 1 << 20})
    with pytest.raises(ValueError, match="dram_bytes must be an int > 0"):
        fr.Tiered(0, str(tmp_path))
    layer = fr.FusedEmbedding(features(), name="dict_tier", tier={"dram_bytes": "1MiB", "path": str(tmp_path)})
    assert layer.tier == fr.Tiered(1 << 20, str(tmp_path))
