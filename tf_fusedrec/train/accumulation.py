"""Gradient accumulation (MTGRBoost, shared/seeds/004 §5.2).

:class:`Accumulator` sums dense gradients and embedding-row gradients per id over K micro-batches trained in separate
steps and applies them once: the update of one step on the union of the K micro-batches (and of every worker's K
micro-batches) with the global-mean loss (train/weighting.py's global count, taken once at apply()).
"""

import tensorflow as tf

from tf_fusedrec import _frameworks
from tf_fusedrec.distributed import comm as comm_lib
from tf_fusedrec.distributed.table import check_table_name
from tf_fusedrec.train.optimizer import embedding_layers, scale_gradient
from tf_fusedrec.train.weighting import global_count

de = _frameworks.de  # TFRA's dynamic_embedding, imported on first use (_frameworks.tfra: an error saying how to get it)


class KeyedSums:
    """Row sums keyed by int64 (a native table's accumulated gradients): a TensorFlow MutableHashTable of float32
    [dim] rows, zeros where a key is missing; the subset of a TFRA variable's interface Accumulator uses (lookup,
    upsert, export, clear). TensorFlow's own table, so accumulation needs no TFRA."""

    def __init__(self, dim, name):
        self.name = name
        self._table = tf.lookup.experimental.MutableHashTable(
            key_dtype=tf.int64, value_dtype=tf.float32, default_value=tf.zeros([dim], tf.float32),
            name=name.replace("/", "_"))

    def lookup(self, keys):
        return self._table.lookup(keys)

    def upsert(self, keys, rows):
        return self._table.insert(keys, rows)

    def export(self):
        return self._table.export()

    def clear(self):
        return self._table.remove(self._table.export()[0])


class Accumulator:
    """Gradient accumulation over K micro-batches trained in separate steps: dense gradients summed in variables,
    embedding-row gradients summed per id in a dynamic table beside each embedding table; one update at apply().

        acc = Accumulator(model, optimizer)          # optimizer: fr.train.make_optimizer(model, ...)

        @tf.function
        def micro_step(batch):
            with tf.GradientTape() as tape:
                loss_sum = tf.reduce_sum(per_sample_losses(model, batch))       # a SUM, not a mean
            variables = model.trainable_variables
            acc.accumulate(zip(tape.gradient(loss_sum, variables), variables), count=batch_size)

        for i, batch in enumerate(batches):
            micro_step(batch)
            if (i + 1) % K == 0:
                tf.function(acc.apply)()   # or a tf.function wrapping it, built once

    Normalisation (``normalize=True``): the micro-steps differentiate SUMS of per-item losses and pass their item
    counts (samples or tokens); apply() sums the counts over workers (one allreduce, G) and hands
    ``accumulated gradient * N / G`` to the optimizer, whose averaging over the N workers makes the update
    ``(1/G) * sum of grad l_i`` over every item of every micro-batch of every worker: one step on the union of all
    of them with the global-mean loss (for any optimizer, SGD included). With ``normalize=False`` the accumulated
    gradients are applied as they are (the losses were normalised by the caller).

    How the rows are found: a FusedEmbedding reads each table once per step through TFRA's ShadowVariable, whose
    ``ids`` hold that step's keys and whose gradient is one row per key (dense, or IndexedSlices into them). A
    micro-step's gradient is therefore only meaningful together with the keys of that step's lookup: accumulate()
    reads them and adds the rows per key into the accumulation table. apply() reads the accumulated keys (sorted),
    points the shadow at them with one more lookup (the rows have not changed since the micro-steps read them:
    nothing is updated in between) and applies the sums through the optimizer, which upserts the rows and their
    optimizer slots. Within ONE step, TrainPipeline(schedule="fwp", micro_batches=K) already trains K micro-batches
    with one table read and one update, but holds all K in one step; this class holds one micro-batch at a time.

    Requirements: the model calls each embedding layer once per micro-step (one lookup per table, as every model in
    tf_fusedrec.models does); the layers were built eagerly (TF2: the tables have shadows) and use no hot-row
    replication; the model's variables exist (call the model once before). Collectives: every worker must run the
    same number of micro-steps between applies (the embeddings' all-to-alls of the micro-steps), and apply() on
    every worker. Accumulated state is not checkpointed: checkpoint right after apply().

    Every variable the Accumulator holds is updated at apply(), with a zero gradient where no micro-batch reached it
    (so every worker issues the same collectives): a no-op for SGD and Adagrad, while optimizers with momentum (Adam)
    move it as they would in any step handing them a zero gradient. Rows of new ids are the ones the micro-steps
    read when the table's initializer is fr.initializers.Hashed (the default: inserted at first read); a TFRA random
    initializer draws the row of an id not yet in the table again at apply().

    Attributes:
      micro_batches: int64 tf.Variable, micro-batches accumulated since the last apply() (or reset()).

    Args:
      model: the Keras model (or layer, or list of layers and models) whose trainable variables are trained.
      optimizer: the optimizer applied at apply(), normally a GroupedOptimizer.
      comm: the workers' Comm; default the optimizer's (or the embedding layers').
      name: names the accumulation tables ({table}/{name}) and the count allreduce (FusedRec/{name}/count).
      normalize: divide by the global count at apply (see above).
    """

    def __init__(self, model, optimizer, comm=None, name="accumulator", normalize=True):
        if not tf.executing_eagerly():
            raise ValueError("Accumulator: create it eagerly (TF2), outside tf.function and tf.compat.v1 graphs")
        self.optimizer, self.name, self.normalize = optimizer, name, bool(normalize)
        layers = embedding_layers(model)
        for layer in layers:
            if getattr(layer, "hot_tables", None):
                raise ValueError(f"Accumulator: layer '{layer.name}' replicates hot rows (replication=...); "
                                 f"accumulating the replicated tables' gradients is not supported")
        if comm is None:
            comm = getattr(optimizer, "comm", None) or (layers[0].comm if layers else None)
        self.comm = comm_lib.get_comm(comm)
        parts = model if isinstance(model, (list, tuple)) else [model]
        variables = [v for part in parts for v in part.trainable_variables]
        if not variables:
            raise ValueError("Accumulator: the model has no trainable variables yet; call it once before")
        self._dense, self._sparse, self._native = {}, {}, {}
        native = {id(t.trainable): t for layer in layers for t in layer.native_tables()}
        for v in variables:
            if id(v) in self._dense or id(v) in self._sparse or id(v) in self._native:  # listed twice
                continue
            if id(v) in native:  # a native table's gradient carries its keys: sums keyed by them
                table = native[id(v)]
                self._native[id(v)] = (v, KeyedSums(table.dim, f"{table.name}/{name}"))
            elif _frameworks.tfra_loaded() and isinstance(v, de.shadow_ops.ShadowVariable):
                table_name = check_table_name(f"{v.params.name}/{name}", f"Accumulator '{name}'")
                with tf.name_scope("FusedRecAccumulator"):
                    sums = de.get_variable(table_name, key_dtype=v.params.key_dtype, value_dtype=v.params.value_dtype,
                                           dim=v.params.dim, initializer=0.0)
                self._sparse[id(v)] = (v, sums)
            elif _frameworks.tfra_loaded() and isinstance(v, de.TrainableWrapper):
                raise ValueError(f"Accumulator: '{v.name}' is a TrainableWrapper (a tf.compat.v1 graph lookup): "
                                 f"build the embedding layers eagerly so their tables have shadows")
            else:
                self._dense[id(v)] = (v, tf.Variable(tf.zeros_like(v), trainable=False,
                                                     name=f"{v.name.split(':')[0]}/{name}"))
        self._count = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}/count")
        self.micro_batches = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}/micro_batches")

    def _key_of(self, var):
        key = id(var)
        if key not in self._dense and key not in self._sparse and key not in self._native:
            raise ValueError(f"Accumulator: variable '{var.name}' was not among the model's trainable variables when "
                             f"the Accumulator was created")
        return key

    def accumulate(self, grads_and_vars, count=None):
        """Adds one micro-batch's gradients (call it in the micro-step, after the model's forward pass).

        Args:
          grads_and_vars: (gradient, variable) pairs, as for apply_gradients; None gradients are skipped.
          count: this worker's items in the micro-batch (int scalar: samples or tokens, matching the loss sum);
            required with normalize=True.

        The additions run eagerly, or as part of the enclosing tf.function (TF2 runs its stateful ops); nothing is
        returned.
        """
        if self.normalize and count is None:
            raise ValueError("Accumulator.accumulate: count (the micro-batch's samples or tokens) is required with "
                             "normalize=True")
        for grad, var in grads_and_vars:
            if grad is None:
                continue
            key = self._key_of(var)
            if key in self._native:
                self._add_keyed_rows(grad, self._native[key][1])
            elif key in self._sparse:
                self._add_rows(grad, *self._sparse[key])
            else:
                self._dense[key][1].assign_add(tf.convert_to_tensor(grad))
        if count is not None:
            self._count.assign_add(tf.cast(count, tf.int64))
        self.micro_batches.assign_add(1)

    @staticmethod
    def _add_rows(grad, shadow, sums):
        keys = shadow.ids.read_value()  # the keys of this step's lookup: row i of the gradient is keys[i]'s
        num_keys = tf.shape(keys)[0]
        if isinstance(grad, tf.IndexedSlices):
            rows = tf.math.unsorted_segment_sum(grad.values, grad.indices, num_keys)
        else:
            rows = tf.convert_to_tensor(grad)
        unique, index = tf.unique(keys, out_idx=tf.int32)
        rows = tf.math.unsorted_segment_sum(rows, index, tf.shape(unique)[0])
        sums.upsert(unique, sums.lookup(unique) + rows)

    @staticmethod
    def _add_keyed_rows(grad, sums):
        """A native table's gradient: IndexedSlices whose indices are the table keys."""
        unique, index = tf.unique(grad.indices, out_idx=tf.int32)
        rows = tf.math.unsorted_segment_sum(grad.values, index, tf.shape(unique)[0])
        sums.upsert(unique, sums.lookup(unique) + rows)

    def apply(self):
        """Applies the accumulated gradients once through the optimizer and clears them.

        Call it eagerly or inside a tf.function (built once and reused); nothing is returned.
        """
        grads_and_vars = []
        for dense, accumulated in self._dense.values():
            grads_and_vars.append((accumulated.read_value(), dense))
        for shadow, sums in self._sparse.values():
            keys, rows = sums.export()
            order = tf.argsort(keys)  # the same order on every worker and in every run
            keys, rows = tf.gather(keys, order), tf.gather(rows, order)
            looked_up = de.shadow_ops.embedding_lookup(shadow, keys)  # points the shadow (and its slots) at keys
            with tf.control_dependencies([looked_up]):
                grads_and_vars.append((tf.identity(rows), shadow))
        for anchor, sums in self._native.values():
            keys, rows = sums.export()
            order = tf.argsort(keys)  # the same order on every worker and in every run
            grads_and_vars.append((tf.IndexedSlices(tf.gather(rows, order), tf.gather(keys, order)), anchor))
        if self.normalize:
            total = tf.cast(global_count(self._count.read_value(), self.comm, f"FusedRec/{self.name}/count"),
                            tf.float32)
            check = tf.debugging.assert_positive(total, message=f"Accumulator '{self.name}'.apply: the global count is "
                                                                f"0 (nothing accumulated on any worker)")
            with tf.control_dependencies([check]):
                scale = tf.cast(self.comm.size, tf.float32) / total
            grads_and_vars = [(scale_gradient(g, scale), v) for g, v in grads_and_vars]
        update = self.optimizer.apply_gradients(grads_and_vars)
        with tf.control_dependencies([update] if update is not None else []):
            self._clear()

    def _clear(self):
        for _, accumulated in self._dense.values():
            accumulated.assign(tf.zeros_like(accumulated))
        for _, sums in list(self._sparse.values()) + list(self._native.values()):
            sums.clear()
        self._count.assign(0)
        self.micro_batches.assign(0)

    def reset(self):
        """Drops what was accumulated without applying it (eagerly or inside a tf.function)."""
        self._clear()
