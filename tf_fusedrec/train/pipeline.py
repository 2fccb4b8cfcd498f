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

Several steps per call (``steps_per_call=K``, ``progress_many()``): one call of a compiled function runs up to K
steps, reading its batches from the dataset iterator inside the function (like Keras' ``steps_per_execution``), so
the Python cost of a call (packing the features' tensors into the call, fetching the next batch) is paid once per K
steps. Everything else is as with K = 1: the same step functions, one step after the other, the same numbers.
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


def _built_variables(model):
    """The model's trainable variables, or None while it is not built (Keras refuses to list the weights of a
    Sequential that has not been called yet)."""
    try:
        return model.trainable_variables
    except ValueError:
        return None


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
    """Trains `model` on `dataset` one synchronous step per progress(), or up to steps_per_call per progress_many().

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
      steps_per_call: K >= 1, the most steps one call of the compiled step runs (progress_many()). With K > 1 the
        call reads its batches from the dataset itself and loops over the steps inside TensorFlow, so the per-call
        Python cost (a few ms for tens of ragged features) is paid once per K steps: it helps where that cost is a
        noticeable part of a step (CPU, small batches, many features) and changes nothing else: the same training,
        step by step, as K = 1. A call stops early at the end of the data and before a bad batch (whose error the
        next call raises): the pipeline checks each batch's ids itself, so with a FusedEmbedding the batches must
        hold its features (as dbp and fwp always need). In dbp and fwp the first batch of each call has its input
        dist un-overlapped (one step in K). The step graph is built once whatever K; K = 1 keeps the per-step path
        (batches fetched in Python).
    """

    def __init__(self, model, optimizer, loss_fn, dataset, schedule="sync", micro_batches=1, cluster_samples=False,
                 step_counter=None, meter=None, loss_scale=None, steps_per_call=1):
        if schedule not in SCHEDULES:
            raise ValueError(f"TrainPipeline: schedule must be one of {SCHEDULES}, got {schedule!r}")
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, (int, np.integer)) or micro_batches < 1:
            raise ValueError(f"TrainPipeline: micro_batches must be an int >= 1, got {micro_batches!r}")
        if isinstance(steps_per_call, bool) or not isinstance(steps_per_call, (int, np.integer)) or steps_per_call < 1:
            raise ValueError(f"TrainPipeline: steps_per_call must be an int >= 1, got {steps_per_call!r}")
        if schedule != "fwp" and (micro_batches != 1 or cluster_samples):
            raise ValueError(f"TrainPipeline: micro_batches and cluster_samples need schedule='fwp' (got "
                             f"schedule={schedule!r}, micro_batches={micro_batches}, cluster_samples={cluster_samples})")
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.schedule, self.micro_batches, self.cluster_samples = schedule, int(micro_batches), bool(cluster_samples)
        # What differs between schedules, chosen once: sync runs a batch per step; dbp and fwp (the same strategy,
        # fwp with k micro-batches) hold the next batch's input dist across steps.
        self._strategy = (SyncSchedule if schedule == "sync" else PipelinedSchedule)(self)
        self.step_counter, self.meter, self.loss_scale = step_counter, meter, loss_scale
        self.steps_per_call = int(steps_per_call)
        variables = _built_variables(model)
        if loss_scale is not None and not variables:  # its tf.cond may skip the first update
            raise ValueError("TrainPipeline: loss_scale needs the model built (call it once on a batch first)")
        if variables and hasattr(optimizer, "create_slots"):
            # The optimizers' variables now, not in the first step's trace: a tf.function whose first call creates
            # variables is traced twice. (A loss scale's tf.cond may also skip the first update.)
            optimizer.create_slots(variables)
        self.embedding = self._find_embedding(model, schedule)
        if schedule != "sync":  # what dbp and fwp are for: all-to-alls of two batches (micro-batches) in flight at once
            from tf_fusedrec.distributed import comm as comm_lib  # noqa: PLC0415

            comm_lib.overlap_collectives()
        self._features = [f.name for f in self.embedding.features] if self.embedding is not None else []
        self._shared_checks = schedule != "sync" and self.embedding.comm.size > 1
        # The batches' value checks travel with them as flags that the pipeline checks (not the dataset map, not the
        # layer): with several workers (_next shares them), and with several steps per call (_read, in the call).
        self._flags_travel = self._shared_checks or self.steps_per_call > 1
        self._iterator = iter(self._prepare(dataset))
        self._error = None  # a bad batch found while prefetching, raised at its own step
        self._functions = {}
        self._call = None  # steps_per_call > 1: the function that runs up to steps_per_call steps
        # Steps completed inside calls, counted by the calls themselves: right even when a call fails part way.
        self._steps_run = tf.Variable(0, dtype=tf.int64, trainable=False) if self.steps_per_call > 1 else None
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
        return self._strategy.prepare(dataset)

    def _checked_split(self, dataset):
        """dbp and fwp: each element as (flags, *micro-batches), the values checked as it is fetched."""
        k, cluster = self.micro_batches, self.cluster_samples
        names = self._features

        shared = self._flags_travel

        def checked_split(features, labels):
            # The layer's own input checks, here, so a bad batch fails when it is fetched: before it is prefetched
            # into the previous step's graph, and with the same message the layer gives. With several workers or
            # several steps per call the values' verdict travels with the batch instead, and _next or _read checks
            # it (one worker's bad batch must stop every worker at the same step; a call must stop before it).
            inputs = self._embedding_inputs(features)
            flags = self._flags(features) if shared else tf.zeros([0], tf.int32)
            _, checks = self.embedding.flatten(inputs, local_checks=not shared)
            with tf.control_dependencies(checks):
                labels = tf.identity(labels)
            if cluster:
                order = clustering.cluster_order(features, names, k)
                features = {n: tf.gather(v, order) for n, v in features.items()}
                labels = tf.gather(labels, order)
            return (flags,) + tuple(_split_rows(features, labels, k))

        # Traced as the steps are, without AutoGraph (tf.data converts a map function by default).
        return dataset.map(tf.autograph.experimental.do_not_convert(checked_split)).prefetch(2)

    def _flags(self, features):
        """int32 [P]: 1 where the batch breaks a value rule of the embedding's features (none without one)."""
        if self.embedding is None:
            return tf.zeros([0], tf.int32)
        return _common.violation_flags(self.embedding.features, self._embedding_inputs(features))[0]

    def _next(self):
        """The next batch as a tuple of (features, labels) micro-batches; None at the end of the data.

        With several workers (dbp, fwp), the workers share each fetched batch's value checks (one small allgather,
        eager, FusedRec/pipeline/valid) before its ids reach an all-to-all, so a bad batch on one worker raises the
        same InvalidArgumentError, naming the feature and the rank, on every worker at the same step."""
        try:
            element = next(self._iterator)
        except StopIteration:
            return None
        return self._strategy.unpack(element)

    def _shared_verdict(self, element):
        """(flags, *micro-batches) -> the micro-batches, once every worker's flags say they are valid."""
        flags, batch = element[0], element[1:]
        if self._shared_checks:
            error = self._violation(self.embedding.comm.allgather(flags[None, :], name="FusedRec/pipeline/valid"))
            if error is not None:
                raise error
        return batch

    def _violation(self, flags):
        """The InvalidArgumentError of every worker's flags (int32 [N, P], N > 1: naming the ranks), or None."""
        flags = np.asarray(flags)
        for i, message in enumerate(_common.violation_messages(self.embedding.features)):
            ranks = [r for r in range(flags.shape[0]) if flags[r, i]]
            if ranks:
                text = _common.violation_message(message, ranks) if self.embedding.comm.size > 1 else message
                return tf.errors.InvalidArgumentError(None, None, text)
        return None

    # --- the compiled steps -------------------------------------------------------------------------------------

    def _embedding_inputs(self, features):
        missing = [n for n in self._features if n not in features]
        if missing:
            raise ValueError(f"{self.embedding.name}: feature '{missing[0]}' is missing from the batch "
                             f"(missing: {missing})")
        return {n: features[n] for n in self._features}

    def _input_dists(self, batch, first_slot, send_after=()):
        # With flags travelling, _next or _read has checked the batch on every worker: no second, in-graph check.
        return tuple(self.embedding.input_dist(self._embedding_inputs(f), slot=first_slot + i, send_after=send_after,
                                               checked=self._flags_travel)
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
            # No AutoGraph: the steps have no tensor-dependent Python control flow. Not inlined into a call of several
            # steps: there, a step that has returned has run all of its ops (see _steps).
            attributes = {"_noinline": True} if self.steps_per_call > 1 else None
            self._functions[kind] = tf.function(body, input_signature=_signature(*example), autograph=False,
                                                experimental_attributes=attributes)
        return self._functions[kind]

    def progress(self):
        """Runs one training step (with steps_per_call > 1: a call of one step); returns its loss (the mean over this
        worker's batch).

        Raises:
          StopIteration: the dataset is exhausted.
          tf.errors.InvalidArgumentError (or the layer's ValueError/TypeError): this step's batch is bad.
        """
        if self.steps_per_call > 1:
            return self.progress_many(1)[0]
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        loss = self._strategy.step()
        self.steps += 1
        if self.meter is not None:
            self.meter.collect_step()
        return loss

    def progress_many(self, max_steps=None):
        """Runs up to steps_per_call steps (and at most `max_steps`) in one call; returns their losses.

        Returns:
          float32 [n] tensor, 1 <= n <= min(max_steps, steps_per_call): the loss of each step run, in order. n is
          smaller than asked only when the data ends, or when the next batch is bad: the steps before it run, and the
          next call raises its error.

        Raises:
          StopIteration: the dataset is exhausted.
          tf.errors.InvalidArgumentError (or the layer's ValueError/TypeError): the call's first batch is bad.
        """
        limit = self.steps_per_call if max_steps is None else max_steps
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
            raise ValueError(f"TrainPipeline.progress_many: max_steps must be an int >= 1, got {max_steps!r}")
        if self.steps_per_call == 1:
            return tf.reshape(tf.cast(self.progress(), tf.float32), [1])
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._call is None:
            # No AutoGraph: _steps builds its loop and conds itself.
            self._call = tf.function(self._steps, input_signature=[tf.TensorSpec([], tf.int32)], autograph=False)
        try:
            losses, status = self._call(tf.constant(min(int(limit), self.steps_per_call), tf.int32))
        finally:
            self.steps = int(self._steps_run.numpy())
        if self.meter is not None:
            self.meter.collect_step()
        error = self._violation(status.numpy()[:, 1:]) if self.embedding is not None else None
        if error is not None:
            if losses.shape[0] == 0:
                raise error
            self._error = error  # the steps before the bad batch ran: the next call raises
        if losses.shape[0] == 0:
            raise StopIteration
        return losses

    # --- several steps per call (steps_per_call > 1) --------------------------------------------------------------
    #
    # One call is a tf.function that reads its batches from the dataset iterator itself and runs up to
    # steps_per_call steps in a tf.while_loop, each step calling the same compiled step function as progress() does
    # (a loop, not steps unrolled in Python: the step graph is built and instantiated once, whatever K). A step runs
    # only if every worker has a valid batch for it (a tf.cond on _read's verdict), so the data may end, or a bad
    # batch come, at any step of a call. Steps run strictly one after the other: the loop runs one iteration at a
    # time, and the next iteration's inputs are made only once the step's function call (not inlined: a call that
    # has returned has run all of its ops) has returned. So steps are as synchronous as separate calls (step k+1
    # reads the tables after step k's update), a failing step leaves the steps before it complete, and no two
    # collectives of the same name (.../keys/slot{s}, FusedRec/dense_gradients, ...) are ever in flight at once:
    # the steps keep today's slots. Within a step, dbp and fwp overlap the next batch's input dist with the step's
    # compute as before; the first batch of each call has an input dist of its own (the "prologue"), so calls carry
    # nothing over.

    def _steps(self, limit):
        """The body of one call: up to `limit` (int32 scalar, 1 <= limit <= steps_per_call) steps -> (float32 [n]
        losses, int32 [N, 1 + P] status: per worker, 1 if it had a batch, then its batch's violation flags, of the
        read that stopped the call; a batch and no flags when nothing stopped it)."""
        return self._strategy.call(limit)

    def _loop(self, limit, iteration, state):
        """Runs iteration(j, limit, state) -> (loss, ran: it ran a step, more: the next may, status, next state) for
        j = 0, 1, ... while the one before said more and j < limit -> (float32 [n] losses, status). The state (the
        batch and its input dist: tensors and ragged tensors) travels as its flat components, with their leading
        dimension free as in the step functions' signatures."""
        spec = tf.nest.map_structure(_relaxed_spec, state)
        components = tf.nest.flatten(spec, expand_composites=True)

        def body(j, more, losses, status, *flat):
            with tf.control_dependencies([j]):  # j comes from the step before, once it has returned
                loss, ran, more, status, state = iteration(
                    j, limit, tf.nest.pack_sequence_as(spec, list(flat), expand_composites=True))
            with tf.control_dependencies([loss, more]):
                j = j + 1
            losses = tf.cond(ran, lambda: tf.concat([losses, tf.reshape(loss, [1])], 0), lambda: losses)
            return (j, more, losses, status, *tf.nest.flatten(state, expand_composites=True))

        _, _, losses, status, *_ = tf.while_loop(
            lambda j, more, *_: more & (j < limit), body,
            (tf.constant(0), tf.constant(True), _no_losses(), self._status_clear(),
             *tf.nest.flatten(state, expand_composites=True)),
            shape_invariants=(tf.TensorShape([]), tf.TensorShape([]), tf.TensorShape([None]),
                              tf.TensorShape([None, 1 + self._num_flags()]), *[c.shape for c in components]),
            parallel_iterations=1, maximum_iterations=self.steps_per_call)
        return losses, status

    def _counted(self, loss):
        """A step's loss (float32), the output of its function call, once _steps_run counts the step."""
        with tf.control_dependencies([loss]):
            counted = self._steps_run.assign_add(1)
        with tf.control_dependencies([counted]):
            return tf.cast(tf.identity(loss), tf.float32)

    def _read(self):
        """The next element, read inside a call -> (its tf.experimental.Optional, bool scalar: every worker has a
        valid batch, int32 [N, 1 + P] status). With several workers (and an embedding to check) the status is shared
        by one small allgather, so that every worker takes the same branch: an end of the data or a bad batch on any
        worker stops every worker at the same step."""
        element = self._iterator.get_next_as_optional()
        present = element.has_value()
        flags = tf.cond(present, lambda: element.get_value()[0], lambda: tf.zeros([self._num_flags()], tf.int32))
        status = tf.concat([tf.reshape(tf.cast(present, tf.int32), [1]), flags], 0)[None]
        if self._shared_status():
            status = self.embedding.comm.allgather(status, name="FusedRec/pipeline/valid")
        return element, tf.reduce_all(status[:, 0] > 0) & tf.reduce_all(tf.equal(status[:, 1:], 0)), status

    def _num_flags(self):
        return 0 if self.embedding is None else len(_common.violation_messages(self.embedding.features))

    def _shared_status(self):
        return self.embedding is not None and self.embedding.comm.size > 1

    def _status_clear(self):
        workers = self.embedding.comm.size if self._shared_status() else 1
        return tf.concat([tf.ones([workers, 1], tf.int32), tf.zeros([workers, self._num_flags()], tf.int32)], 1)

    def concrete_step(self):
        """The concrete function of the steady-state step (for counting its collectives), once it has run."""
        function = self._functions.get(self._strategy.steady_kind)
        return None if function is None else function.get_concrete_function()


# --- the schedules -------------------------------------------------------------------------------------------------
#
# A schedule strategy holds what differs between schedules: how the dataset's elements are shaped (prepare, unpack),
# what one step runs (step) and what one call of several steps runs (call). TrainPipeline keeps what they share: the
# dataset iterator, the compiled functions, the checks, the counters.

class SyncSchedule:
    """sync: each step runs its batch's whole lookup, forward, backward and update; nothing is held across steps."""

    steady_kind = "sync"  # the compiled function of a steady step

    def __init__(self, pipe):
        self.pipe = pipe

    def prepare(self, dataset):
        if self.pipe.steps_per_call == 1:
            return dataset.map(lambda f, y: ((f, y),)).prefetch(2)
        return dataset.map(lambda f, y: (self.pipe._flags(f), (f, y))).prefetch(2)

    def unpack(self, element):
        return element

    def step(self):
        pipe = self.pipe
        batch = pipe._next()
        if batch is None:
            raise StopIteration
        return pipe._function("sync", batch)(batch)

    def call(self, limit):
        return self.pipe._loop(limit, self._iteration, ())

    def _iteration(self, j, limit, state):  # noqa: ARG002  (sync carries no state)
        pipe = self.pipe
        element, ok, status = pipe._read()

        def train():
            batch = element.get_value()[1:]
            return pipe._counted(pipe._function("sync", batch)(batch)), pipe._status_clear()

        loss, status = tf.cond(ok, train, lambda: (tf.constant(0.0), status))
        return loss, ok, ok, status, state


class PipelinedSchedule:
    """dbp and fwp: step t also runs batch t+1's input dist, so the next batch and its dist are held between steps
    (self.pending); fwp's micro-batches are the pipeline's micro_batches."""

    steady_kind = "step"

    def __init__(self, pipe):
        self.pipe = pipe
        self.pending = None  # (micro-batches, their dists) of the next step, prefetched

    def prepare(self, dataset):
        return self.pipe._checked_split(dataset)

    def unpack(self, element):
        return self.pipe._shared_verdict(element)

    def step(self):
        pipe = self.pipe
        if self.pending is None:
            batch = pipe._next()
            if batch is None:
                raise StopIteration
            self.pending = (batch, pipe._function("prologue", batch)(batch))
        batch, dists = self.pending
        try:
            following = pipe._next()
        except tf.errors.InvalidArgumentError as e:  # the next batch is bad: finish this step, fail the next
            following, pipe._error = None, e
        if following is None:
            loss = pipe._function("last", batch, dists)(batch, dists)
            self.pending = None
        else:
            loss, next_dists = pipe._function("step", batch, dists, following)(batch, dists, following)
            self.pending = (following, next_dists)
        return loss

    def call(self, limit):
        pipe = self.pipe
        element, ok, status = pipe._read()

        def start():
            batch = element.get_value()[1:]
            return pipe._loop(limit, self._iteration, (batch, pipe._function("prologue", batch)(batch)))

        return tf.cond(ok, start, lambda: (_no_losses(), status))

    def _iteration(self, j, limit, state):
        """Step j of a call, whose batch's input dist is done: with the next batch's input dist when the call has a
        next batch, else as the last step."""
        pipe = self.pipe
        batch, dists = state

        def last(status):
            loss = pipe._counted(pipe._function("last", batch, dists)(batch, dists))
            return loss, tf.constant(False), status, state

        def read_and_step():
            element, ok, status = pipe._read()

            def step():
                following = element.get_value()[1:]
                loss, next_dists = pipe._function("step", batch, dists, following)(batch, dists, following)
                return pipe._counted(loss), tf.constant(True), pipe._status_clear(), (following, next_dists)

            return tf.cond(ok, step, lambda: last(status))

        loss, more, status, state = tf.cond(j + 1 < limit, read_and_step, lambda: last(pipe._status_clear()))
        return loss, tf.constant(True), more, status, state


def _no_losses():
    return tf.zeros([0], tf.float32)


def _split_rows(features, labels, k):
    """k contiguous micro-batches of a batch (the last takes the remainder); ragged features split by rows."""
    batch = tf.shape(labels)[0]
    bounds = [(batch * i) // k for i in range(k + 1)]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        yield {n: v[lo:hi] for n, v in features.items()}, labels[lo:hi]
