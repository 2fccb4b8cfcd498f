"""Mixed precision dense layers: fr.train.DynamicLossScale in TrainPipeline (train/loss_scale.py) and the models under
Keras's mixed_float16 policy, one worker (the 2-worker run is tests/apps/test_train_grm.py's "mixed" run).

* a power-of-two loss scale changes nothing on a float32 model: tables, slots and dense weights equal the unscaled
  run's bit for bit, sync and dbp;
* an overflowing step is skipped (weights, rows and optimizer iterations unchanged), the scale halves and `skipped`
  counts it; `growth_interval` finite steps double it;
* the DLRM and the GRM under mixed_float16 return float32 logits close to their float32 forward with the same
  weights, and train with finite losses.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec import config as cfg
from tf_fusedrec.distributed.comm import SingleProcessComm
from tf_fusedrec.train import experiment


@pytest.fixture(autouse=True)
def _float32_policy_after():
    """The tests set a mixed-precision policy; the next test (any module's) starts from float32 again (conftest's
    fresh_keras_session clears the session around each test)."""
    yield
    tf.keras.mixed_precision.set_global_policy("float32")


class Model(tf.keras.Model):
    def __init__(self, name):
        super().__init__()
        features = [fr.Feature("a", dim=4, max_id_bits=8), fr.Feature("b", dim=4, max_id_bits=8)]
        self.embedding = fr.FusedEmbedding(features, optimizer={"name": "adam", "learning_rate": 0.05}, name=name)
        self.dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=3))

    def call(self, inputs, training=None):
        out = self.embedding(inputs, training=training)
        return self.dense(tf.concat([out["a"], out["b"]], axis=1))[:, 0]


def dataset(steps=6, scale=1.0):
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 20, (steps, 8)), rng.integers(0, 20, (steps, 8))
    y = rng.random((steps, 8)).astype(np.float32) * scale
    return tf.data.Dataset.from_tensor_slices(({"a": a, "b": b}, y))


def state(model, optimizer):
    table = model.embedding.tables[0]
    keys, rows = (x.numpy() for x in table.params.export())
    order = np.argsort(keys)
    slots = [slot.lookup(tf.constant(keys[order])).numpy() for _, slot in optimizer.slot_tables(table.trainable)]
    return [keys[order], rows[order], *slots] + [v.numpy() for v in model.dense.weights]


def train(name, schedule, loss_scale=None, steps=6, label_scale=1.0):
    model = Model(name)
    ds = dataset(steps, scale=label_scale)
    model(next(iter(ds))[0])
    optimizer = fr.train.make_optimizer(model, default={"name": "sgd", "learning_rate": 0.1})
    pipe = fr.train.TrainPipeline(model, optimizer, tf.keras.losses.MeanSquaredError(), ds, schedule=schedule,
                                  loss_scale=loss_scale)
    losses = [float(pipe.progress()) for _ in range(steps - (schedule == "dbp"))]
    return model, optimizer, losses


@pytest.mark.parametrize("schedule", ["sync", "dbp"])
def test_power_of_two_scale_changes_nothing(schedule):
    plain_model, plain_opt, plain_losses = train("plain", schedule)
    scale = fr.train.DynamicLossScale(SingleProcessComm(), initial=2.0 ** 10, growth_interval=1000)
    scaled_model, scaled_opt, scaled_losses = train("scaled", schedule, scale)
    assert plain_losses == scaled_losses
    for got, want in zip(state(scaled_model, scaled_opt), state(plain_model, plain_opt)):
        np.testing.assert_array_equal(got, want)
    assert int(scale.skipped.numpy()) == 0 and float(scale.scale.numpy()) == 2.0 ** 10


def test_overflow_skips_the_step_and_halves_the_scale():
    scale = fr.train.DynamicLossScale(SingleProcessComm(), initial=3e38, growth_interval=2)
    model = Model("skip")
    ds = dataset(4, scale=100.0)
    model(next(iter(ds))[0])
    optimizer = fr.train.make_optimizer(model, default="sgd")
    pipe = fr.train.TrainPipeline(model, optimizer, tf.keras.losses.MeanSquaredError(), ds, loss_scale=scale)
    dense_before = [v.numpy() for v in model.dense.weights]
    pipe.progress()  # loss x 3e38 overflows float32: skipped
    assert int(scale.skipped.numpy()) == 1 and float(scale.scale.numpy()) == pytest.approx(1.5e38)
    for v, before in zip(model.dense.weights, dense_before):
        np.testing.assert_array_equal(v.numpy(), before)
    assert int(optimizer.iterations.numpy()) == 0
    assert int(model.embedding.tables[0].params.size()) > 0  # rows read (inserted) but not updated
    scale.scale.assign(1.0)
    pipe.progress()
    pipe.progress()  # two finite steps: growth_interval 2 doubles the scale
    assert float(scale.scale.numpy()) == 2.0 and int(scale.skipped.numpy()) == 1
    assert int(optimizer.iterations.numpy()) == 2


def test_bad_loss_scale_arguments():
    with pytest.raises(ValueError, match="initial must be > 0"):
        fr.train.DynamicLossScale(SingleProcessComm(), initial=0)
    with pytest.raises(ValueError, match="growth_interval an int >= 1"):
        fr.train.DynamicLossScale(SingleProcessComm(), growth_interval=0)


@pytest.mark.parametrize("config_path", ["configs/criteo_synthetic.yaml", "configs/grm_synthetic.yaml"])
def test_models_under_mixed_float16(config_path):
    config = cfg.load_config(config_path)

    def build(policy, name):
        tf.keras.mixed_precision.set_global_policy(policy)
        embedding = experiment.make_embedding("fused", config.embedding_features(), config, name=name)
        return experiment.make_model(config, embedding)

    features, labels = next(iter(experiment.make_dataset(config, 16, 0, 1)))
    full = build("float32", "emb32")
    want = full(features, training=False)
    half = build("mixed_float16", "emb16")
    half(features, training=False)
    for target, source in zip(half.weights, full.weights):  # the same weights (dense: float32 variables)
        target.assign(source)
    for table_16, table_32 in zip(half.embedding.tables, full.embedding.tables):
        keys, rows = table_32.params.export()
        table_16.params.upsert(keys, rows)
    got = half(features, training=False)
    assert got.dtype == tf.float32 and got.shape == want.shape
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0.05, atol=0.02)
    # A few mixed_float16 steps train, with finite losses.
    optimizer = fr.train.make_optimizer(half, default="adam")
    loss_fn = experiment.global_mean_loss(SingleProcessComm()) if config.data.source == "grm_synthetic" else \
        experiment.binary_cross_entropy()
    ds = experiment.make_dataset(config, 16, 0, 1)
    pipe = fr.train.TrainPipeline(half, optimizer, loss_fn, ds,
                                  loss_scale=fr.train.DynamicLossScale(SingleProcessComm()))
    losses = [float(pipe.progress()) for _ in range(3)]
    assert all(np.isfinite(losses)), losses
