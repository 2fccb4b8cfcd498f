"""TrainPipeline's arguments, end of data, and errors (one worker, in process). The equality of the schedules is
tested in tests/distributed/test_pipeline.py."""

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr


class Linear(tf.keras.Model):
    def __init__(self, embedding):
        super().__init__()
        self.embedding = embedding
        self.dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1))

    def call(self, inputs, training=None):
        out = self.embedding({"user": inputs["user"], "tags": inputs["tags"]}, training=training)
        return self.dense(tf.concat([out["user"], out["tags"]], axis=1))[:, 0]


def make(layer_cls=fr.FusedEmbedding):
    layer = layer_cls([fr.Feature("user", 4), fr.Feature("tags", 4, combiner="sum")], name="pipe")
    model = Linear(layer)
    return model, fr.train.make_optimizer(model, default="sgd")


def data(steps, bad_step=None):
    rows = []
    for s in range(steps):
        user = np.arange(4, dtype=np.int64) + s
        if s == bad_step:
            user[2] = -4
        rows.append(({"user": user, "tags": tf.ragged.constant([[1], [], [2, 3], [s]], tf.int64)},
                     np.ones(4, np.float32)))

    def gen():
        yield from rows

    spec = ({"user": tf.TensorSpec([None], tf.int64), "tags": tf.RaggedTensorSpec([None, None], tf.int64, 1)},
            tf.TensorSpec([None], tf.float32))
    return tf.data.Dataset.from_generator(gen, output_signature=spec)


def mse(labels, predictions):
    return tf.reduce_mean(tf.square(predictions - labels))


@pytest.mark.parametrize("kwargs,match", [
    ({"schedule": "async"}, "schedule must be one of"),
    ({"schedule": "fwp", "micro_batches": 0}, "micro_batches must be an int >= 1"),
    ({"schedule": "fwp", "micro_batches": True}, "micro_batches must be an int >= 1"),
    ({"schedule": "sync", "micro_batches": 2}, "need schedule='fwp'"),
    ({"schedule": "dbp", "cluster_samples": True}, "need schedule='fwp'"),
])
def test_bad_arguments(kwargs, match):
    model, opt = make()
    with pytest.raises(ValueError, match=match):
        fr.train.TrainPipeline(model, opt, mse, data(2), **kwargs)


def test_per_feature_embedding_trains_with_sync_only():
    model, opt = make(fr.PerFeatureEmbedding)
    with pytest.raises(ValueError, match="exactly one FusedEmbedding"):
        fr.train.TrainPipeline(model, opt, mse, data(2), schedule="dbp")
    pipe = fr.train.TrainPipeline(model, opt, mse, data(2), schedule="sync")
    assert np.isfinite(float(pipe.progress()))


@pytest.mark.parametrize("schedule,k", [("sync", 1), ("dbp", 1), ("fwp", 2), ("fwp", 3)])
def test_runs_every_batch_once_then_stops(schedule, k):
    model, opt = make()
    counter = tf.Variable(0, dtype=tf.int64)
    pipe = fr.train.TrainPipeline(model, opt, mse, data(3), schedule=schedule, micro_batches=k,
                                  step_counter=counter)
    losses = [float(pipe.progress()) for _ in range(3)]
    with pytest.raises(StopIteration):
        pipe.progress()
    with pytest.raises(StopIteration):
        pipe.progress()
    assert pipe.steps == 3 and int(counter.numpy()) == 3 and all(np.isfinite(losses))


def test_one_batch_dataset():
    model, opt = make()
    pipe = fr.train.TrainPipeline(model, opt, mse, data(1), schedule="dbp")
    pipe.progress()
    with pytest.raises(StopIteration):
        pipe.progress()


@pytest.mark.parametrize("schedule", ["sync", "dbp", "fwp"])
def test_bad_batch_fails_at_its_step(schedule):
    model, opt = make()
    pipe = fr.train.TrainPipeline(model, opt, mse, data(4, bad_step=2), schedule=schedule,
                                  micro_batches=2 if schedule == "fwp" else 1)
    pipe.progress()
    pipe.progress()
    rows_before = int(model.embedding.tables[0].size())
    # Inside a tf.function TensorFlow escapes the quotes of an assertion's message.
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature \\*'user\\*': ids must be >= 0"):
        pipe.progress()
    assert pipe.steps == 2 and int(model.embedding.tables[0].size()) == rows_before


def test_missing_feature_in_the_batch_is_named():
    model, opt = make()
    ds = data(2).map(lambda f, y: ({"tags": f["tags"]}, y))
    with pytest.raises(ValueError, match="feature 'user' is missing from the batch"):
        fr.train.TrainPipeline(model, opt, mse, ds, schedule="dbp")


@pytest.mark.parametrize("backend", ["tfra", "native"])
@pytest.mark.parametrize("dense", ["sgd", "adam"])
def test_a_built_model_is_traced_once(backend, dense):
    """The optimizers' variables (slots, step counts, hyperparameters) exist before the first step, so the step's
    first call creates none and TensorFlow traces it once (a first call that creates variables is traced twice).
    An unbuilt model still trains (its variables come with the first step)."""
    layer = fr.FusedEmbedding([fr.Feature("user", 4), fr.Feature("tags", 4, combiner="sum")],
                              name="pipe_traced", table_backend=backend)
    model = Linear(layer)
    opt = fr.train.make_optimizer(model, default=dense)
    model({"user": tf.constant([1, 2], tf.int64), "tags": tf.ragged.constant([[1], []], tf.int64)}, training=False)
    pipe = fr.train.TrainPipeline(model, opt, mse, data(3))
    created = []
    with tf.variable_creator_scope(lambda next_creator, **kw: created.append(kw.get("name")) or next_creator(**kw)):
        pipe.progress()
    assert created == []
    pipe.progress()
    assert pipe._functions["sync"].experimental_get_tracing_count() == 1  # noqa: SLF001

    tf.keras.backend.clear_session()
    unbuilt, opt = make()
    fr.train.TrainPipeline(unbuilt, opt, mse, data(1)).progress()
    assert unbuilt.dense.built


@pytest.mark.keras2
@pytest.mark.parametrize("default", [lambda: tf.keras.optimizers.SGD(0.1), lambda: tf.keras.optimizers.Adam(0.01)])
def test_a_keras_optimizer_instance_as_default_trains_like_its_legacy_twin(default):
    """A (non-legacy) Keras optimizer passed as the dense default makes its variables at its first update (the
    pipeline creates the legacy optimizers' ahead): same losses as the legacy optimizer of the same rule."""
    losses = []
    for make_default in (default, lambda: getattr(tf.keras.optimizers.legacy, type(default()).__name__)(
            default().learning_rate.numpy())):
        tf.keras.backend.clear_session()
        layer = fr.FusedEmbedding([fr.Feature("user", 4), fr.Feature("tags", 4, combiner="sum")], name="pipe_keras")
        model = Linear(layer)
        opt = fr.train.make_optimizer(model, default=make_default())
        model({"user": tf.constant([1, 2], tf.int64), "tags": tf.ragged.constant([[1], []], tf.int64)},
              training=False)
        pipe = fr.train.TrainPipeline(model, opt, mse, data(3))
        losses.append([float(pipe.progress()) for _ in range(3)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
