"""FusedEmbedding's two-part form (input_dist, then lookup_and_output) equals its call; micro-batches looked up
together equal separate calls; injected outputs; table names derived from the layer name; on one worker the table's
unique rows go straight to the combine op (group_lookup.UniqueRows), bit for bit the gather to the received order
they replace."""

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec.distributed import group_lookup as gl

from tests.layers.test_hot_replication import Trainer
from tests.layers.test_hot_replication import batch as hot_batch


def features(max_id_bits=None):
    return [fr.Feature("user", 4, max_id_bits=max_id_bits), fr.Feature("item", 4, max_id_bits=max_id_bits),
            fr.Feature("tags", 3, combiner="mean", max_id_bits=max_id_bits),
            fr.Feature("hist", 3, max_id_bits=max_id_bits)]


def batch(seed, rows=6):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 4, rows)
    hist = rng.integers(0, 9, (rows, 2))
    hist[rng.random((rows, 2)) < 0.3] = -1
    return {"user": tf.constant(rng.integers(0, 9, rows), tf.int64),
            "item": tf.constant(rng.integers(0, 9, rows), tf.int64),
            "tags": tf.RaggedTensor.from_row_lengths(tf.constant(rng.integers(0, 9, lengths.sum()), tf.int64),
                                                     lengths),
            "hist": tf.constant(hist, tf.int64)}


def dense(out):
    return {k: (v.to_tensor() if isinstance(v, tf.RaggedTensor) else v).numpy() for k, v in out.items()}


@pytest.mark.parametrize("bits", [None, 20], ids=["hashed", "packed"])
@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("training", [True, False])
def test_two_parts_equal_the_call(bits, mode, training):
    layer = fr.FusedEmbedding(features(bits), name="stages")
    inputs = batch(0)

    def two_parts(x):
        return layer.lookup_and_output(layer.input_dist(x), training=training)

    def call(x):
        return layer(x, training=training)

    if mode == "function":
        two_parts, call = tf.function(two_parts), tf.function(call)
    got, want = dense(two_parts(inputs)), dense(call(inputs))
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=0, err_msg=k)


def test_micro_batches_looked_up_together_equal_separate_calls_and_their_gradients():
    layer = fr.FusedEmbedding(features(), name="stages")
    parts = [batch(1, 4), batch(2, 3)]
    layer(parts[0]), layer(parts[1])  # insert every row first, so both sides read the same table
    with tf.GradientTape(persistent=True) as tape:
        together = layer.lookup_and_output_many([layer.input_dist(p) for p in parts], training=True)
        loss_together = tf.add_n([tf.reduce_sum(o["user"] * 2.0) + tf.reduce_sum(o["tags"]) for o in together])
    grads_together = tape.gradient(loss_together, layer.trainable_variables)
    for got, part in zip(together, parts):
        want = dense(layer(part, training=False))
        for k, v in dense(got).items():
            np.testing.assert_allclose(v, want[k], rtol=1e-6, atol=1e-7, err_msg=k)
    # One lookup over the union: the dense gradient of the table's trainable handle sums both micro-batches.
    assert all(g is not None for g in grads_together)


def test_statistics_sum_over_micro_batches():
    layer = fr.FusedEmbedding(features(), name="stages")
    parts = [batch(3, 4), batch(4, 5)]
    layer.lookup_and_output_many([layer.input_dist(p) for p in parts], training=True)
    together = {k: {s: int(v) for s, v in d.items()} for k, d in layer.statistics().items()}
    separate = []
    for p in parts:
        layer(p, training=True)
        separate.append({k: {s: int(v) for s, v in d.items()} for k, d in layer.statistics().items()})
    for name in together:
        for stat in ("ids", "unique_sent", "unique_looked_up"):
            assert together[name][stat] == separate[0][name][stat] + separate[1][name][stat], (name, stat)


def test_injected_outputs_are_returned_by_the_next_call():
    layer = fr.FusedEmbedding(features(), name="stages")
    inputs = batch(5)
    outputs = layer.lookup_and_output(layer.input_dist(inputs))
    marker = {k: v * 0 + 7 for k, v in outputs.items()}
    with layer.injected(marker):
        with pytest.raises(RuntimeError, match="cannot nest"):
            with layer.injected(marker):
                pass
        got = layer(inputs)
    assert got is marker
    assert not np.allclose(dense(layer(inputs))["user"], 7)  # outside the block: a real lookup again
    with layer.injected(marker), pytest.raises(ValueError, match="feature 'user' is missing"):
        layer({k: v for k, v in inputs.items() if k != "user"})


def test_input_dist_checks_ids_before_any_lookup():
    layer = fr.FusedEmbedding(features(), name="stages")
    bad = batch(6)
    bad["item"] = tf.constant([0, -3, 1, 2, 3, 4], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 'item': ids must be >= 0"):
        layer.input_dist(bad)
    assert all(int(t.size()) == 0 for t in layer.tables)


def test_table_names_come_from_the_layer_and_group_and_collide_loudly():
    layer = fr.FusedEmbedding(features(), name="emb")
    assert [t.name for t in layer.tables] == [f"emb/{g.name}" for g in layer.groups]
    assert layer.collective_prefix(layer.groups[0]) == f"FusedRec/emb/{layer.groups[0].name}"
    with pytest.raises(ValueError, match="an embedding table named 'emb/group0_d3_adagrad' already exists"):
        fr.FusedEmbedding(features(), name="emb")
    with tf.compat.v1.variable_scope("second_model"):
        other = fr.FusedEmbedding(features(), name="emb")
    assert other.tables[0].params.name != layer.tables[0].params.name


@pytest.mark.parametrize("backend", ["native", "tfra"])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "hashed"])
def test_one_worker_unique_rows_straight_to_the_combine_equal_the_gather(backend, optimizer, packed):
    """One worker: lookup returns the table's unique rows with each fused position's index (UniqueRows) and
    output_sums combines them with one op, where the other path gathers them to the received order first. Ten
    training steps give bit for bit the same losses, outputs, rows and optimizer slots; the other path is what the
    layer runs when the flag is off, and the flag is on by default on one worker without replication."""
    direct = Trainer(optimizer, packed=packed, name="direct", table_backend=backend)
    gathered = Trainer(optimizer, packed=packed, name="gathered", table_backend=backend)
    assert all(g._unique_rows_out for g in direct.layer.group_lookups)  # noqa: SLF001
    for g in gathered.layer.group_lookups:
        g._unique_rows_out = False  # noqa: SLF001
    dist = direct.layer.input_dist(hot_batch(0))
    assert isinstance(direct.layer.group_lookups[0].lookup([dist.groups[0]], False)[0], gl.UniqueRows)
    for step in range(10):
        inputs = hot_batch(step, seed=3)
        (loss_d, out_d), (loss_g, out_g) = direct.step(inputs), gathered.step(inputs)
        assert loss_d.numpy() == loss_g.numpy(), step
        for name in out_d:
            d, g = out_d[name], out_g[name]
            if isinstance(d, tf.RaggedTensor):
                d, g = d.flat_values, g.flat_values
            np.testing.assert_array_equal(d.numpy(), g.numpy(), err_msg=f"{name} at step {step}")
    rows_d, rows_g = direct.rows(), gathered.rows()
    assert sorted(rows_d) == sorted(rows_g) and rows_d
    for key in rows_d:
        np.testing.assert_array_equal(rows_d[key], rows_g[key], err_msg=str(key))
