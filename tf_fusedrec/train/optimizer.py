"""Training helpers: one optimizer object that updates every table with its group's optimizer.

``fr.train.make_optimizer(model, default="adam")`` finds the model's FusedEmbedding / PerFeatureEmbedding layers
and returns a :class:`GroupedOptimizer`. Each table's variables go to a TFRA ``DynamicEmbeddingOptimizer`` built
from that group's OptimizerSpec; every other variable goes to the default (dense) optimizer.

Semantics with N workers, when each worker's loss is the mean over its local batch (equal local batch sizes):
dense gradients are averaged over workers (Horovod allreduce), and embedding gradients, which the embeddings
all-to-all has already delivered to the owner summed over the workers that asked for a row, are divided by N. The
update is then the one a single worker makes on the union of the batches with the loss averaged over it.

Tables stored as float16 (FusedEmbedding(storage="float16")) are updated in float32 like the others; right after the
update, apply_gradients runs each layer's after_update(optimizer), which rounds the updated rows into the float16 store
and, for layers with eviction (FusedEmbedding(eviction=...)), evicts after every `interval`-th update. Stochastic
rounding (FusedEmbedding(rounding="stochastic")) draws its bits from the group optimizer's update count: the native
table's update takes iterations + 1, the TFRA table's commit reads iterations after the update advanced it.

Replicated (hot) rows (FusedEmbedding(replication=...)) are read on every worker: their gradients are averaged over
workers in the same grouped allreduce as the dense gradients, which is the sharded rows' sum over workers times 1/N,
so every worker applies the same update to its copy, and the one a sharded table would apply.

Equal dense start: with N workers the dense weights must start equal, or each worker trains its own dense model while
the averaged gradients hide it. The GroupedOptimizer makes them equal, so that a user's script need not broadcast
them: rank 0's values of every dense variable are broadcast to the others once, before the first update. make_optimizer
does it at once for the dense variables that exist then (a built model: the run is then the one a single worker makes
from rank 0's weights); apply_gradients does it, before the first update (iterations == 0), for those created later (a
model built by its first call, as model.fit and most custom loops build it: the first step's gradients were computed
from each worker's own start, as with Horovod's broadcast after the first batch). Once done, or with one worker,
nothing is added to a step but the check of `iterations`; the tables need nothing: each row lives on its owner only,
and a row starts from its id (the Hashed initializer), equal wherever it is created. A restored checkpoint gives every
worker the same weights and an `iterations` above 0.
"""

import tensorflow as tf

from tf_fusedrec import _frameworks
from tf_fusedrec import _keras
from tf_fusedrec import config as cfg
from tf_fusedrec.layers.protocol import is_embedding_layer, unconverted

de = _frameworks.de  # TFRA's dynamic_embedding, imported on first use (_frameworks.tfra: an error saying how to get it)


def embedding_layers(model):
    """The embedding layers of a model, a layer, or a list of layers."""
    if is_embedding_layer(model):
        return [model]
    if isinstance(model, (list, tuple)):
        return [m for m in model if is_embedding_layer(m)]
    found, seen = [], set()
    for layer in _layers_under(model):
        if id(layer) not in seen:
            seen.add(id(layer))
            found.append(layer)
    return found


def _layers_under(obj):
    """The embedding layers in obj: a Keras model or layer (either Keras: _flatten_layers, recursively, which finds
    layers kept in lists and dicts too) or a tf.Module holding them. A Keras 3 layer is no tf.Module, so a tf.Module's
    submodules do not reach it: its attributes are searched for Keras layers, then each of those."""
    if is_embedding_layer(obj):
        return [obj]
    if hasattr(obj, "_flatten_layers"):
        return [m for m in obj._flatten_layers(include_self=False, recursive=True) if is_embedding_layer(m)]
    if isinstance(obj, tf.Module):
        keras_like = obj._flatten(predicate=lambda m: is_embedding_layer(m) or hasattr(m, "_flatten_layers"))  # noqa: SLF001
        return [layer for leaf in keras_like for layer in _layers_under(leaf)]
    return []


def _build(optimizer):
    if _keras.is_optimizer(optimizer):
        return optimizer
    return cfg.optimizer_spec(optimizer, "default optimizer").build()


def _base_init(optimizer, name):
    """Keras' own Optimizer.__init__ for GroupedOptimizer: Keras 3's takes a learning rate (unused here: every
    update goes through the wrapped optimizers), tf_keras' does not."""
    if _keras.legacy():
        tf.keras.optimizers.Optimizer.__init__(optimizer, name=name)
    else:
        tf.keras.optimizers.Optimizer.__init__(optimizer, learning_rate=0.0, name=name)


class GroupedOptimizer(tf.keras.optimizers.Optimizer):
    """Applies each group's optimizer to its table and the default optimizer to the dense variables.

    Use ``apply_gradients(zip(grads, vars))`` in a custom loop, ``minimize(loss, var_list, tape)``, or pass it to
    ``model.compile(optimizer=...)`` for ``model.fit``. It is a Keras optimizer (of the Keras the process runs: Keras 3,
    or tf_keras) only so that Keras accepts it: all state lives in the wrapped optimizers, and ``iterations`` counts
    calls of apply_gradients.

    Each group's optimizer is a Keras optimizer built from its OptimizerSpec. A native table's update runs in place in
    the table (NativeEmbeddingTable.apply_gradients) with that optimizer's current learning rate and step count, which
    it advances once per step; a TFRA table's goes through TFRA's DynamicEmbeddingOptimizer around it (Keras 2 only).
    """

    def __init__(self, groups, default, comm, name="GroupedOptimizer", replicated=(), after_update=(), native=()):
        _base_init(self, name)
        self.comm = comm
        # Tables stored natively (FusedEmbedding(table_backend="native")), by their trainable handle: their update
        # runs in place in the table, with the group's optimizer's hyperparameters and step count.
        self._native = {str(id(t.trainable)): t for t in native}
        for table in native:
            table.claimed = True  # its gradient comes to this optimizer (NativeEmbeddingTable: nothing kept pending)
        # functions(this optimizer) -> op or None, run in order after every update (the layers' after_update).
        self._after_update = list(after_update)
        self._replicated = {str(id(v)) for v in replicated}
        tfra_tables = any(str(id(v)) not in self._native for _, variables in groups for v in variables)
        dense = _build(default)
        # With TFRA tables (Keras 2), every optimizer is wrapped in TFRA's DynamicEmbeddingOptimizer as before.
        self.dense = de.DynamicEmbeddingOptimizer(dense) if tfra_tables else dense
        # Checkpointed: the optimizers (with their slots). Not checkpointed: which variable goes where, keyed by
        # id() as a string (a checkpoint cannot hold int keys) and rebuilt with the model.
        self.sparse = []
        for spec, variables in groups:
            native_group = all(str(id(v)) in self._native for v in variables)
            built = spec.build(for_tfra=not native_group)
            self.sparse.append(built if native_group else de.DynamicEmbeddingOptimizer(built))
        self._var_index = {str(id(v)): i for i, (_, variables) in enumerate(groups) for v in variables}
        # The dense variables already made equal on every worker (start_equal), by id: apply_gradients does not again.
        self._started_equal = set()

    def sparse_optimizer_of(self, variable):
        """The TFRA optimizer that updates a table's trainable handle."""
        return self.sparse[self._var_index[str(id(variable))]]

    def start_equal(self, variables):
        """Gives every worker rank 0's values of `variables` (dense ones: not the tables), now, in one broadcast; ->
        the ops (the module docstring, "Equal dense start"). Nothing with one worker. make_optimizer and the first
        apply_gradients call it; a restore after it overwrites the variables with the checkpoint's, equal too."""
        variables = [v for v in variables if str(id(v)) not in self._var_index]
        if self.comm.size == 1 or not variables:
            return []
        values = self.comm.broadcast([_keras.read(v) for v in variables], name="FusedRec/dense_start", root_rank=0)
        if tf.executing_eagerly():  # done; a trace is not (the function may be traced again, and run later)
            self._started_equal.update(str(id(v)) for v in variables)
        return [op for op in (_keras.assign(v, x) for v, x in zip(variables, values)) if op is not None]

    def _start_equal_before_first_update(self, variables):
        """start_equal(variables) in the step whose update is this optimizer's first (iterations == 0), for those not
        equal yet; -> the ops that follow it, or [] (one worker, or all equal already: nothing is added to the step)."""
        variables = [v for v in variables if str(id(v)) not in self._started_equal]
        if self.comm.size == 1 or not variables:
            return []

        def broadcast():
            with tf.control_dependencies(self.start_equal(variables)):
                return tf.constant(True)

        first = tf.equal(tf.cast(self.iterations, tf.int64), 0)
        return [tf.cond(first, broadcast, lambda: tf.constant(False))]

    @unconverted  # no AutoGraph inside a user's tf.function (layers/protocol.py): nothing here needs it
    def apply_gradients(self, grads_and_vars, name=None, **kwargs):  # noqa: ARG002  (Keras passes extras)
        per_optimizer = {}
        dense, replicated, dense_variables = [], [], []
        for grad, var in grads_and_vars:
            index = self._var_index.get(str(id(var)))
            if index is None:
                dense_variables.append(var)
            if grad is None:
                continue
            if index is None:
                dense.append((grad, var))
                continue
            if str(id(var)) in self._replicated:
                replicated.append((index, grad, var))
                continue
            if self.comm.size > 1:
                grad = scale_gradient(grad, 1.0 / self.comm.size)
            per_optimizer.setdefault(index, []).append((grad, var))
        if self.comm.size > 1 and (dense or replicated):
            # A native hot table's gradient averages its values and keeps its keys (the step's replicated hot keys,
            # equal on every worker and in the same order); the rest averages densely (a TFRA shadow's gradient is
            # dense over the step's rows).
            grads = [tf.convert_to_tensor(g) for g, _ in dense] + [
                g.values if str(id(v)) in self._native else tf.convert_to_tensor(g) for _, g, v in replicated]
            reduced = self.comm.allreduce(grads, name="FusedRec/dense_gradients", op="average")
            dense = list(zip(reduced[:len(dense)], [v for _, v in dense]))
            replicated = [(i, tf.IndexedSlices(r, g.indices, g.dense_shape) if str(id(v)) in self._native else r, v)
                          for (i, g, v), r in zip(replicated, reduced[len(dense):])]
        for index, grad, var in replicated:
            per_optimizer.setdefault(index, []).append((grad, var))
        ops = []
        for index, pairs in sorted(per_optimizer.items()):
            native = [(g, self._native[str(id(v))]) for g, v in pairs if str(id(v)) in self._native]
            if native:  # the group's tables (sharded and hot) updated in place, then its step counted once
                group = self.sparse[index]
                rate = _keras.current_learning_rate(group)
                count = tf.cast(group.iterations, tf.int64) + 1  # this update's 1-based number
                updates = [table.apply_gradients(grad, rate, count) for grad, table in native]
                with tf.control_dependencies([u for u in updates if u is not None]):
                    ops.append(self.sparse[index].iterations.assign_add(1))
            else:
                ops.append(self.sparse[index].apply_gradients(pairs))
        if dense:
            with tf.control_dependencies(self._start_equal_before_first_update(dense_variables)):
                ops.append(self.dense.apply_gradients(dense))
        ops = [o for o in ops if o is not None]
        for fn in self._after_update:  # in order, each after the one before
            with tf.control_dependencies(ops):
                op = fn(self)
            ops = ops if op is None else [op]
        with tf.control_dependencies(ops):
            return self.iterations.assign_add(1)

    def slot_tables(self, variable):
        """[(slot name, slot TFRA variable)] of a table's trainable handle, sorted by name (the slots must exist:
        after an update, or create_slots)."""
        native = self._native.get(str(id(variable)))
        if native is not None:
            return native.slots()
        opt = self.sparse_optimizer_of(variable)
        return [(name, opt.get_slot(variable, name).params) for name in sorted(opt.get_slot_names())]

    def create_slots(self, variables):
        """Creates now what the first update of `variables` would create (the wrapped optimizers do it lazily
        otherwise): their optimizers' slots, step counts and hyperparameters (a native table's slots live beside
        its rows: only its group optimizer's). For a restore to write them, so the first update may sit inside a
        tf.cond (a loss scale that skips steps), and so that a tf.function's first call creates no variable: one
        that does is traced twice (TensorFlow traces again without variable creation), doubling the cost of
        building a training step."""
        per_optimizer = {}
        for var in variables:
            index = self._var_index.get(str(id(var)))
            group = per_optimizer.setdefault(index, [])
            if str(id(var)) not in self._native:
                group.append(var)
        for index, group in per_optimizer.items():
            _create_weights(self.dense if index is None else self.sparse[index], group)

    def build(self, var_list):
        """What Keras 3's fit calls before the first step with the model's trainable variables: builds the dense
        optimizer's slots for the dense ones (the tables' optimizers need no build)."""
        _create_weights(self.dense, [v for v in var_list if str(id(v)) not in self._var_index])
        self.built = True

    @unconverted
    def minimize(self, loss, var_list, tape=None):
        if tape is None:
            raise ValueError("GroupedOptimizer.minimize needs the GradientTape that recorded the loss")
        grads = tape.gradient(loss, var_list)
        return self.apply_gradients(zip(grads, var_list))


def _create_weights(optimizer, variables):
    """An optimizer's step count, hyperparameters and the slots of `variables`, created now: a legacy (OptimizerV2)
    optimizer's for these variables; a Keras 3-style optimizer's build() takes every variable at once, so it is built
    on the first non-empty call (GroupedOptimizer.build or create_slots with the dense variables)."""
    if hasattr(optimizer, "_create_all_weights"):
        optimizer._create_all_weights(variables)  # noqa: SLF001
    elif variables and not getattr(optimizer, "built", True):
        optimizer.build(list(variables))


def scale_gradient(grad, factor):
    """grad * factor, for a tensor or IndexedSlices."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
    return grad * factor


def make_optimizer(model, default="adam", comm=None):
    """A GroupedOptimizer for `model` (a Keras model, an embedding layer, or a list of layers).

    Args:
      model: where to find FusedEmbedding / PerFeatureEmbedding layers.
      default: optimizer of the dense variables: a name, a dict with "name", or a Keras optimizer instance.
      comm: defaults to the embedding layers' comm.
    """
    layers = embedding_layers(model)
    if not layers:
        raise ValueError("make_optimizer: no FusedEmbedding or PerFeatureEmbedding layer found in the model")
    groups = [g for layer in layers for g in layer.optimizer_groups()]
    replicated = [v for layer in layers for v in layer.replicated_variables()]
    optimizer = GroupedOptimizer(groups, default, comm if comm is not None else layers[0].comm, replicated=replicated,
                                 after_update=[layer.after_update for layer in layers],
                                 native=[t for layer in layers for t in layer.native_tables()])
    if tf.executing_eagerly():
        # What the first update would create for the tables (slots, step counts, hyperparameters) and the dense
        # optimizer's step count and hyperparameters, now: a training step whose first call creates no variable is
        # traced once, not twice. (The dense slots follow the dense variables: TrainPipeline creates them once the
        # model is built.)
        optimizer.create_slots([v for _, variables in groups for v in variables])
        _create_weights(optimizer.dense, [])
        # The dense weights that exist already start equal on every worker now (a model not built yet: at its first
        # update; the module docstring).
        optimizer.start_equal(_trainable_variables(model))
    return optimizer


def _trainable_variables(model):
    """The trainable variables of a Keras model or layer, or of a list of them, that exist now: none of a model that
    refuses to list its weights before it is built (tf_keras' Sequential raises ValueError)."""
    found = []
    for m in model if isinstance(model, (list, tuple)) else [model]:
        try:
            found.extend(m.trainable_variables)
        except ValueError:
            continue
    return found
