"""TrainPipeline: one synchronous training step per ``progress()``, with the embedding lookup split into stages and
overlapped across batches (NestPipe, shared/seeds/001: §IV dual-buffer pipelining, §V frozen-window pipelining).

    pipe = fr.train.TrainPipeline(model, optimizer, loss_fn, dataset, schedule="dbp")
    for _ in range(steps):
        loss = pipe.progress()

Schedules (every one is the same training as ``sync``; tests compare them number for number):

* ``sync``: input dist, table read, embeddings all-to-all, dense forward and backward, update, in one step.
* ``dbp`` (dual-buffer pipelining): step t also runs batch t+1's input dist (fuse, sender unique, partition, keys
  all-to-all, category unique on the owner): only ids move early. Batch t+1's rows are read in step t+1, after step
  t's update, so nothing is stale (NestPipe Proposition 1 without the buffer refresh: the rows are read after the
  update instead of refreshed). The keys all-to-all of t+1 and the compute of t are independent ops of one graph,
  which TensorFlow's executor runs concurrently (Horovod's collectives are asynchronous kernels).
* ``fwp`` (frozen-window pipelining, on top of dbp): the batch is split into ``micro_batches`` k. One table read
  serves all k (the window is frozen: nothing is updated until the end of the step); each micro-batch has its own
  embeddings all-to-all, dense forward and backward, and gradient all-to-all, so the all-to-all of micro-batch i+1
  runs while micro-batch i computes. Gradients of the k micro-batches are summed, weighted by their sizes, and
  applied once (Proposition 2): the loss is the mean over the whole batch, as in ``sync``.
* ``cluster_samples=True`` (fwp): key-centric sample clustering reorders each batch in the tf.data pipeline, off the
  step, so that samples sharing ids land in the same micro-batch and fewer keys are sent twice.

The model must call its FusedEmbedding once per forward pass with the embedding's feature dict (every model in
tf_fusedrec.models does); the pipeline computes the embeddings itself and hands them to that call
(``FusedEmbedding.injected``). Models whose output for a sample depends on other samples of the batch (batch norm)
would see micro-batches in fwp. Bad input stops ``progress()`` with the layer's error naming the feature, at the
step whose batch is bad, before that batch's ids reach any all-to-all; the previous step completes first. With several
workers the check is shared: a bad batch on one worker stops every worker at that step with the same error, which
names the rank whose batch it was.
"""

import numpy as np
import tensorflow as tf

from tf_fusedrec.layers import _common
from tf_fusedrec.train import clustering
from tf_fusedrec.train.optimizer import embedding_layers

SCHEDULES = ("sync", "dbp", "fwp")


def _relaxed_spec(value):
    """The value's type spec with its leading (batch or length) dimension unknown, so one trace serves every step."""
    spec = tf.type_spec_from_value(value)
    if isinstance(spec, tf.TensorSpec) and spec.shape.rank:
        return tf.TensorSpec([None] + spec.shape[1:].as_list(), spec.dtype)
    if isinstance(spec, tf.RaggedTensorSpec):
        return tf.RaggedTensorSpec([None] + spec.shape[1:].as_list(), spec.dtype, spec.ragged_rank,
                                   spec.row_splits_dtype)
    return spec


def _signature(*values):
    return [tf.nest.map_structure(_relaxed_spec, v) for v in values]


def _after_gradient(tensors, sink):
    """Identity on a list of tensors; when the gradients of all the float ones are computed, calls sink(gradients)
    (which builds a side effect, e.g. recording a time stamp; nothing waits for it)."""
    floats = [i for i, t in enumerate(tensors) if t.dtype.is_floating]

    @tf.custom_gradient
    def identity(*xs):
        def grad(*upstream):
            sink(list(upstream))
            return list(upstream)

        return [tf.identity(x) for x in xs], grad

    out = list(tensors)
    for i, t in zip(floats, identity(*[tensors[i] for i in floats])):
        out[i] = t
    return out


def _stamp(deps):
    with tf.control_dependencies(deps):
        return tf.timestamp()


class TrainPipeline:
    """Trains `model` on `dataset` one synchronous step per progress().

    Args:
      model: a Keras model holding one FusedEmbedding (any model for schedule="sync"); model(features,
        training=True) -> predictions.
      optimizer: what fr.train.make_optimizer returns.
      loss_fn: loss_fn(labels, predictions) -> the mean loss over the (micro-)batch, e.g. a Keras loss.
      dataset: a tf.data.Dataset of (features dict, labels) batches, this worker's share.
      schedule: "sync", "dbp" or "fwp".
      micro_batches: k micro-batches per batch (fwp only): contiguous rows [n*i//k, n*(i+1)//k) of the (clustered)
        batch, so their sizes differ by at most one; the loss weights each by its size.
      cluster_samples: reorder samples so that micro-batches share keys (fwp only).
      step_counter: an optional int64 tf.Variable incremented by each step (for checkpoints).
      meter: an optional AlltoallMeter whose comm the embedding uses; the dense compute of each micro-batch is then
        time-stamped too, so exposed all-to-all time can be measured.
      loss_scale: None, or an fr.train.DynamicLossScale for float16 dense layers (Keras mixed_float16): the step
        scales the loss, unscales the gradients in float32 and skips, on every worker, an update whose gradients
        overflowed (train/loss_scale.py). Needs the model built.
    """

    def __init__(self, model, optimizer, loss_fn, dataset, schedule="sync", micro_batches=1, cluster_samples=False,
                 step_counter=None, meter=None, loss_scale=None):
        if schedule not in SCHEDULES:
            raise ValueError(f"TrainPipeline: schedule must be one of {SCHEDULES}, got {schedule!r}")
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, (int, np.integer)) or micro_batches < 1:
            raise ValueError(f"TrainPipeline: micro_batches must be an int >= 1, got {micro_batches!r}")
        if schedule != "fwp" and (micro_batches != 1 or cluster_samples):
            raise ValueError(f"TrainPipeline: micro_batches and cluster_samples need schedule='fwp' (got "
                             f"schedule={schedule!r}, micro_batches={micro_batches}, cluster_samples={cluster_samples})")
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.schedule, self.micro_batches, self.cluster_samples = schedule, int(micro_batches), bool(cluster_samples)
        self.step_counter, self.meter, self.loss_scale = step_counter, meter, loss_scale
        if loss_scale is not None:  # its tf.cond may skip the first update: the slots must exist before
            if not model.trainable_variables:
                raise ValueError("TrainPipeline: loss_scale needs the model built (call it once on a batch first)")
            optimizer.create_slots(model.trainable_variables)
        self.embedding = self._find_embedding(model, schedule)
        self._features = [f.name for f in self.embedding.features] if self.embedding is not None else []
        self._shared_checks = schedule != "sync" and self.embedding.comm.size > 1
        self._iterator = iter(self._prepare(dataset))
        self._pending = None  # (micro-batches, their dists) of the next step, prefetched
        self._error = None  # a bad batch found while prefetching, raised at its own step
        self._functions = {}
        self.steps = 0

    @staticmethod
    def _find_embedding(model, schedule):
        from tf_fusedrec.layers import FusedEmbedding  # noqa: PLC0415

        fused = [layer for layer in embedding_layers(model) if isinstance(layer, FusedEmbedding)]
        if schedule == "sync":
            return fused[0] if len(fused) == 1 else None
        if len(fused) != 1:
            raise ValueError(f"TrainPipeline: schedule={schedule!r} needs a model with exactly one FusedEmbedding "
                             f"(found {len(fused)}); other embedding layers train with schedule='sync'")
        return fused[0]

    # --- input pipeline (tf.data, off the step) -----------------------------------------------------------------

    def _prepare(self, dataset):
        if self.schedule == "sync":
            return dataset.map(lambda f, y: ((f, y),)).prefetch(2)
        k, cluster = self.micro_batches, self.cluster_samples
        names = self._features

        shared = self._shared_checks

        def checked_split(features, labels):
            # The layer's own input checks, here, so a bad batch fails when it is fetched: before it is prefetched
            # into the previous step's graph, and with the same message the layer gives. With several workers the
            # values' verdict travels with the batch instead, and _next shares it (one worker's bad batch must stop
            # every worker at the same step, see _next).
            inputs = self._embedding_inputs(features)
            flags = _common.violation_flags(self.embedding.features, inputs)[0] if shared else tf.zeros([0], tf.int32)
            _, checks = self.embedding.flatten(inputs, local_checks=not shared)
            with tf.control_dependencies(checks):
                labels = tf.identity(labels)
            if cluster:
                order = clustering.cluster_order(features, names, k)
                features = {n: tf.gather(v, order) for n, v in features.items()}
                labels = tf.gather(labels, order)
            return (flags,) + tuple(_split_rows(features, labels, k))

        return dataset.map(checked_split).prefetch(2)

    def _next(self):
        """The next batch as a tuple of (features, labels) micro-batches; None at the end of the data.

        With several workers (dbp, fwp), the workers share each fetched batch's value checks (one small allgather,
        eager, FusedRec/pipeline/valid) before its ids reach an all-to-all, so a bad batch on one worker raises the
        same InvalidArgumentError, naming the feature and the rank, on every worker at the same step."""
        try:
            element = next(self._iterator)
        except StopIteration:
            return None
        if self.schedule == "sync":
            return element
        flags, batch = element[0], element[1:]
        if self._shared_checks:
            everyone = self.embedding.comm.allgather(flags[None, :], name="FusedRec/pipeline/valid").numpy()
            for i, message in enumerate(_common.violation_messages(self.embedding.features)):
                ranks = [r for r in range(everyone.shape[0]) if everyone[r, i]]
                if ranks:
                    raise tf.errors.InvalidArgumentError(None, None, _common.violation_message(message, ranks))
        return batch

    # --- the compiled steps -------------------------------------------------------------------------------------

    def _embedding_inputs(self, features):
        missing = [n for n in self._features if n not in features]
        if missing:
            raise ValueError(f"{self.embedding.name}: feature '{missing[0]}' is missing from the batch "
                             f"(missing: {missing})")
        return {n: features[n] for n in self._features}

    def _input_dists(self, batch, first_slot, send_after=()):
        # With several workers, _next has checked the batch on every worker: no second, in-graph shared check.
        return tuple(self.embedding.input_dist(self._embedding_inputs(f), slot=first_slot + i, send_after=send_after,
                                               checked=self._shared_checks)
                     for i, (f, _) in enumerate(batch))

    def _train(self, batch, dists, following=None):
        """Forward, backward and update of one batch (its micro-batches); dists None: sync (the input dist too).
        With `following` (the next batch), also its input dist, whose keys all-to-alls are sent once this batch's
        rows have arrived: -> (loss, next dists)."""
        next_dists = None
        with tf.GradientTape() as tape:
            if dists is None:
                (features, labels), = batch
                losses = [self.loss_fn(labels, self.model(features, training=True))]
                weights = [1.0]
            else:
                outputs = self.embedding.lookup_and_output_many(list(dists), training=True)
                if following is not None:
                    with tape.stop_recording():
                        arrived = tf.nest.flatten(outputs, expand_composites=True)
                        next_dists = self._input_dists(following, self.micro_batches, send_after=arrived)
                sizes = [tf.cast(tf.shape(labels)[0], tf.float32) for _, labels in batch]
                total = tf.add_n(sizes)
                losses, weights = [], []
                for out, (features, labels), size in zip(outputs, batch, sizes):
                    losses.append(self._micro_batch_loss(out, features, labels))
                    weights.append(size / total)
            loss = tf.add_n([w * l for w, l in zip(weights, losses)])
            target = loss if self.loss_scale is None else self.loss_scale.scaled(loss)
        variables = self.model.trainable_variables
        grads = tape.gradient(target, variables)
        if self.loss_scale is None:
            update = self.optimizer.apply_gradients(zip(grads, variables))
        else:  # float16 dense layers: unscaled in float32; every worker skips a step whose gradients overflowed
            grads = self.loss_scale.unscale(grads)
            update = self.loss_scale.apply(grads, lambda: self.optimizer.apply_gradients(zip(grads, variables)))
        deps = [update] if update is not None else []
        if self.step_counter is not None:
            deps.append(self.step_counter.assign_add(1))
        with tf.control_dependencies(deps):
            loss = tf.identity(loss)
        return loss if following is None else (loss, next_dists)

    def _micro_batch_loss(self, outputs, features, labels):
        if self.meter is None:
            with self.embedding.injected(outputs):
                return self.loss_fn(labels, self.model(features, training=True))
        # Time-stamp the dense compute of this micro-batch: forward from its embeddings being ready to its
        # predictions, backward from the gradient reaching the predictions to it reaching all its embeddings. The
        # stamps and their recording are side effects nothing waits for.
        flat = tf.nest.flatten(outputs, expand_composites=True)
        forward_start = _stamp(flat)
        marks = {}
        flat = _after_gradient(flat, lambda grads: self.meter.record_compute(marks["backward_start"], _stamp(grads)))
        with self.embedding.injected(tf.nest.pack_sequence_as(outputs, flat, expand_composites=True)):
            predictions = self.model(features, training=True)
        self.meter.record_compute(forward_start, _stamp([predictions]))
        predictions, = _after_gradient([predictions], lambda grads: marks.setdefault("backward_start", _stamp(grads)))
        return self.loss_fn(labels, predictions)

    def _function(self, kind, *example):
        """The compiled function of a kind, traced once with relaxed shapes."""
        if kind not in self._functions:
            body = {
                "sync": lambda batch: self._train(batch, None),
                "prologue": lambda batch: self._input_dists(batch, self.micro_batches),
                "step": lambda batch, dists, following: self._train(batch, dists, following),
                "last": lambda batch, dists: self._train(batch, dists),
            }[kind]
            # No AutoGraph: the steps have no tensor-dependent Python control flow.
            self._functions[kind] = tf.function(body, input_signature=_signature(*example), autograph=False)
        return self._functions[kind]

    def progress(self):
        """Runs one training step; returns its loss (the mean over this worker's batch).

        Raises:
          StopIteration: the dataset is exhausted.
          tf.errors.InvalidArgumentError (or the layer's ValueError/TypeError): this step's batch is bad.
        """
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self.schedule == "sync":
            batch = self._next()
            if batch is None:
                raise StopIteration
            loss = self._function("sync", batch)(batch)
        else:
            if self._pending is None:
                batch = self._next()
                if batch is None:
                    raise StopIteration
                self._pending = (batch, self._function("prologue", batch)(batch))
            batch, dists = self._pending
            try:
                following = self._next()
            except tf.errors.InvalidArgumentError as e:  # the next batch is bad: finish this step, fail the next
                following, self._error = None, e
            if following is None:
                loss = self._function("last", batch, dists)(batch, dists)
                self._pending = None
            else:
                loss, next_dists = self._function("step", batch, dists, following)(batch, dists, following)
                self._pending = (following, next_dists)
        self.steps += 1
        if self.meter is not None:
            self.meter.collect_step()
        return loss

    def concrete_step(self):
        """The concrete function of the steady-state step (for counting its collectives), once it has run."""
        kind = "sync" if self.schedule == "sync" else "step"
        function = self._functions.get(kind)
        return None if function is None else function.get_concrete_function()


def _split_rows(features, labels, k):
    """k contiguous micro-batches of a batch (the last takes the remainder); ragged features split by rows."""
    batch = tf.shape(labels)[0]
    bounds = [(batch * i) // k for i in range(k + 1)]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        yield {n: v[lo:hi] for n, v in features.items()}, labels[lo:hi]
