"""The native table backend: one C++ hash table per group (cc/kernels/native_table_op.cc), rows and optimizer slots
side by side, a training lookup that initialises missing keys in the same probe, and the sparse optimizer applied in
place (``FusedEmbedding(table_backend="native")``).

Against the TFRA backend (tf_fusedrec/distributed/table.py) a training step saves, per key: the existence lookup and
upsert of Hashed initial rows, the ShadowVariable's copy of the step's rows, and the optimizer's two finds and two
upserts (rows and each slot); what is left is one probe to read and one probe to update.

How the gradient reaches the table: the trainable handle is a one-element ``tf.Variable`` (``anchor``) that the
lookup reads under a ``tf.custom_gradient``; its gradient is an ``IndexedSlices`` whose indices are the table keys of
the step and whose values are their rows' gradients. fr.train.GroupedOptimizer recognises the anchor and calls
:meth:`NativeEmbeddingTable.apply_gradients`, which runs the group's optimizer in place (TF's update formulas; see
the op). No copy of the rows is kept between the lookup and the update.

Checkpoints, export and the summary reach the rows and each optimizer slot through :class:`NativeRows` views, which
offer the subset of a TFRA variable's interface they use (lookup, upsert, remove, export, size, dim, name), so a
checkpoint written with one backend restores into the other (slots match by their TFRA names).
"""

import tensorflow as tf

from tf_fusedrec import initializers
from tf_fusedrec.distributed import admission as admission_lib
from tf_fusedrec.distributed.table import check_storage, make_admission

NATIVE_OPTIMIZERS = ("sgd", "adagrad", "adam")
# Hyperparameters the native update implements, per optimizer (Keras legacy names); anything else is refused.
_SUPPORTED_CONFIG = {
    "sgd": {"learning_rate"},
    "adagrad": {"learning_rate", "initial_accumulator_value", "epsilon"},
    "adam": {"learning_rate", "beta_1", "beta_2", "epsilon"},
}


def check_native_spec(optimizer_spec, initializer, owner):
    """Refuses, naming `owner` (layer and group), an optimizer or initializer the native table does not implement."""
    name = optimizer_spec.name
    if name not in NATIVE_OPTIMIZERS:
        raise ValueError(f"{owner}: table_backend='native' implements the optimizers {NATIVE_OPTIMIZERS}, the group "
                         f"uses {name!r}; use table_backend='tfra' for it")
    extra = sorted(set(dict(optimizer_spec.config)) - _SUPPORTED_CONFIG[name])
    if extra:
        raise ValueError(f"{owner}: table_backend='native' implements {name} with {sorted(_SUPPORTED_CONFIG[name])}; "
                         f"got also {extra}; use table_backend='tfra' for it")
    _initializer_attrs(initializer, owner)


def _initializer_attrs(initializer, owner):
    """The create op's initializer attributes of a spec's initializer (Hashed, or a Keras constant/zeros/ones)."""
    if initializers.is_hashed(initializer):
        return {"init": "hashed", "seed": initializer.seed, "stddev": initializer.stddev}
    config = initializer.get_config() if hasattr(initializer, "get_config") else {}
    kind = type(initializer).__name__
    if kind == "Zeros":
        return {"init": "constant", "value": 0.0}
    if kind == "Ones":
        return {"init": "constant", "value": 1.0}
    if kind == "Constant" and isinstance(config.get("value"), (int, float)):
        return {"init": "constant", "value": float(config["value"])}
    raise ValueError(f"{owner}: table_backend='native' initialises new rows with fr.initializers.Hashed or a Keras "
                     f"Zeros/Ones/Constant(scalar); got {initializer!r} (TFRA draws random rows that depend on the "
                     f"order keys arrive in); use table_backend='tfra' for it")


class NativeRows:
    """One part of a native table as a TFRA-variable-like object: the rows (part 0) or optimizer slot part-1.

    What checkpoints, export, hot-set moves and the summary use: lookup(keys, return_exists), upsert, remove, export,
    size, dim, name, value_dtype."""

    def __init__(self, table, part, name):
        self._table, self.part, self.name = table, part, name
        self.dim = table.dim
        self.value_dtype = tf.float16 if part == 0 and table.storage == "float16" else tf.float32

    def lookup(self, keys, return_exists=False):
        values, exists = self._table.ops.native_table_find(self._table.resource, tf.convert_to_tensor(keys, tf.int64), part=self.part)
        return (values, exists) if return_exists else values

    def upsert(self, keys, values):
        return self._table.ops.native_table_upsert(self._table.resource, tf.convert_to_tensor(keys, tf.int64),
                                      tf.convert_to_tensor(values, tf.float32), part=self.part)

    def remove(self, keys):
        """Removes whole keys (the row and every slot: they live together)."""
        return self._table.ops.native_table_remove(self._table.resource, tf.convert_to_tensor(keys, tf.int64))

    def export(self):
        """(keys int64 [K], values float32 [K, dim]) of this part."""
        keys, rows, slots = self._table.ops.native_table_export(self._table.resource)
        return keys, (rows if self.part == 0 else slots[:, self.part - 1])

    def size(self):
        return self._table.ops.native_table_size(self._table.resource)


class NativeEmbeddingTable:
    """A sharded table of `dim`-wide rows keyed by int64 with the group's optimizer slots beside each row.

    Args:
      name: the table's name, derived from the layer's and the group's (must be unique in the process).
      dim: row width.
      initializer: the spec's initializer (Hashed, or a Keras Zeros/Ones/Constant).
      salts: for Hashed, the int64 feature_salt of each category (index = category).
      optimizer: the group's OptimizerSpec (sgd, adagrad or adam): decides the slots.
      storage: "float32" or "float16" (rows stored as float16, read as float32, each update computed in float32
        and rounded once; slots stay float32). A new key's initial row is rounded when it is inserted, where the TFRA
        backend keeps it float32 until the key's first update: the two agree to one float16 rounding, not bit for
        bit (an update's rounding is bit for bit the TFRA backend's, nearest or stochastic).
      rounding: "nearest" or "stochastic" (float16 storage only): how an update's row is rounded to float16
        (tf_fusedrec/distributed/rounding.py).
      track_access: count each training lookup's keys (count, last clock) in the table, for eviction and expiry.
      admission: None or an fr.Admission: keys get a row only once a training lookup has read them min_count times
        (tf_fusedrec/distributed/admission.py).
    """

    backend = "native"

    def __init__(self, name, dim, initializer, salts, optimizer, storage="float32", track_access=False,
                 admission=None, rounding="nearest"):
        from tf_fusedrec.ops import native_table_ops  # noqa: PLC0415  (the op library loads lazily)

        self.ops = native_table_ops
        self.name, self.dim, self.initializer = name, dim, initializer
        self._lookup_keys = None  # the keys tensor of the last training lookup (_trainable; apply_gradients)
        self.storage = check_storage(storage, f"table {name}")
        check_native_spec(optimizer, initializer, f"table {name}")
        self.optimizer = optimizer
        config = dict(optimizer.config)
        slot_names = native_table_ops.SLOT_NAMES[optimizer.name]
        slot_init = [float(config.get("initial_accumulator_value", 0.1))] if optimizer.name == "adagrad" else (
            [0.0] * len(slot_names))
        self._slot_names = slot_names
        self.resource = native_table_ops.NativeTableResource(
            name=name, dim=dim, optimizer=optimizer.name, slot_init=slot_init, storage=self.storage,
            salts=[int(s) for s in salts], track_access=track_access, rounding=rounding,
            **_initializer_attrs(initializer, f"table {name}"))
        prefix = name.replace("/", "_")
        # The trainable handle: its gradient is IndexedSlices(rows' gradients, table keys) (module docstring).
        self.anchor = tf.Variable(tf.zeros([1]), trainable=True, name=f"{prefix}_native_anchor")
        self.rows = NativeRows(self, 0, name)
        self.params = self.rows  # what ShardedTable / ReplicatedTable hand to checkpoints and the summary
        if track_access:
            self.evicted = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{prefix}_evicted")
            self.expired = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{prefix}_expired")
        self.admission = make_admission(admission, name)  # AdmissionCounter or None

    @property
    def trainable(self):
        """The variable the optimizer and checkpoints key this table by."""
        return self.anchor

    @property
    def trainable_variables(self):
        return [self.anchor]

    def slots(self):
        """[(slot name, NativeRows)] sorted by name, as GroupedOptimizer.slot_tables gives TFRA's."""
        return sorted((n, NativeRows(self, i + 1, f"{self.name}/{n}")) for i, n in enumerate(self._slot_names))

    def lookup(self, keys, categories, ids, training):
        """Rows of unique keys [U] -> float32 [U, dim]; missing keys get their initial rows (inserted unless training
        is False), and the result is trainable through `anchor` unless training is False. Arguments as
        EmbeddingTable.lookup."""
        keys = tf.convert_to_tensor(keys, tf.int64)
        ids = keys if ids is None else ids
        categories = tf.zeros_like(keys, tf.int32) if categories is None else categories
        if training is False:
            return self._initial_lookup(keys, categories, ids)
        if self.admission is None:
            return self._training_lookup(keys, categories, ids)
        exists = self.ops.native_table_find(self.resource, keys).exists
        return admission_lib.admitted_lookup(keys, categories, ids, self.admission.admit(keys, exists),
                                             self._training_lookup, self._initial_lookup)

    def _initial_lookup(self, keys, categories, ids):
        """Rows of keys, initial rows for the keys not held; inserts nothing."""
        return self.ops.native_table_lookup_or_init(self.resource, keys, categories, ids, insert=False)

    def _training_lookup(self, keys, categories, ids):
        """Rows of keys, inserting the missing ones and counting accesses, trainable through `anchor`."""
        rows = self.ops.native_table_lookup_or_init(self.resource, keys, categories, ids, insert=True)
        return self._trainable(rows, keys)

    def _trainable(self, rows, keys):
        anchor = self.anchor
        # The keys of the last training lookup: a gradient whose indices are this very tensor holds each key once
        # (lookup takes unique keys), so apply_gradients may skip deduplicating them. Any other indices (several
        # lookups' gradients aggregated, accumulated micro-batches) are deduplicated as usual.
        self._lookup_keys = keys

        @tf.custom_gradient
        def attach(rows):
            anchor.read_value()  # the tape records the anchor as used here, and hands its gradient to grad

            def grad(upstream, variables=None):
                slices = tf.IndexedSlices(upstream, keys, tf.constant([1, self.dim], tf.int64))
                return None, [slices] * len(variables or [])

            return tf.identity(rows), grad

        return attach(rows)

    def apply_gradients(self, grad, optimizer):
        """Applies `optimizer` (the group's Keras legacy optimizer: its hyperparameters, and its step count for
        Adam and stochastic rounding, which the caller advances once per step for all of the group's tables) to the
        rows of grad (IndexedSlices from the anchor: values [U, dim], indices the keys) in place; -> the update op."""
        values = tf.convert_to_tensor(grad.values, tf.float32)
        keys = tf.convert_to_tensor(grad.indices, tf.int64)
        lr = tf.cast(optimizer._decayed_lr(tf.float32), tf.float32)  # noqa: SLF001  (Keras' own schedule hook)
        beta_1 = beta_2 = tf.constant(0.0)
        epsilon = tf.constant(float(getattr(optimizer, "epsilon", 0.0) or 0.0), tf.float32)
        if self.optimizer.name == "adam":  # Keras legacy Adam's bias correction (its _prepare_local)
            beta_1 = optimizer._get_hyper("beta_1", tf.float32)  # noqa: SLF001
            beta_2 = optimizer._get_hyper("beta_2", tf.float32)  # noqa: SLF001
            lr = self.ops.adam_bias_corrected_lr(lr, beta_1, beta_2, optimizer.iterations + 1)
        # Keys the step's lookup inserted: categories and ids only matter for a key missing here, which is none.
        # The 1-based number of this update: the update count the TFRA backend's commit rounds with.
        update_count = tf.cast(optimizer.iterations, tf.int64) + 1
        distinct = grad.indices is self._lookup_keys  # never None: a gradient has indices
        return self.ops.native_table_apply_sparse(self.resource, keys, values, tf.zeros_like(keys, tf.int32), keys,
                                                  lr, beta_1, beta_2, epsilon, update_count=update_count,
                                                  distinct_keys=distinct)

    # --- eviction and expiry (tf_fusedrec/distributed/eviction.py, admission.py) ---------------------------------

    def evict(self, capacity, policy, slots=()):  # noqa: ARG002  (the slots live beside the rows)
        """Removes the rows over `capacity` by `policy` (with their slots and status); -> rows evicted so far."""
        from tf_fusedrec.distributed import eviction  # noqa: PLC0415

        return self._remove_by_status(
            lambda keys, counts, lasts, clock: eviction.victims(keys, counts, lasts, clock, capacity, policy),
            self.evicted)

    def expire(self, steps, slots=()):  # noqa: ARG002  (the slots live beside the rows)
        """Removes the rows no training lookup has read in the last `steps` lookups (with their slots and status);
        -> rows expired so far."""
        return self._remove_by_status(
            lambda keys, counts, lasts, clock: admission_lib.expired(keys, lasts, clock, steps), self.expired)

    def _remove_by_status(self, select, counter):
        gone = select(*self.ops.native_table_access_status(self.resource))
        with tf.control_dependencies([self.ops.native_table_remove(self.resource, gone)]):
            return counter.assign_add(tf.size(gone, out_type=tf.int64))

    def access_status(self):
        """(keys int64 [K], counts int64 [K], lasts int64 [K], clock int64 scalar): every key's status (0, 0 where
        no training lookup read it) and the lookups' clock; what checkpoints save."""
        return tuple(self.ops.native_table_access_status(self.resource))

    def set_access_status(self, keys, counts, lasts, clock):
        """Sets the status of keys int64 [K] to (counts, lasts) int64 [K] and the clock (a checkpoint's restore);
        every key must hold its row already (native_table_set_access_status: an error otherwise)."""
        return self.ops.native_table_set_access_status(self.resource, keys, counts, lasts, clock)

    def commit(self, update_count=None):  # noqa: ARG002  (the update itself rounds, with its update count)
        """Nothing to do: float16 rows are rounded by the update itself."""
        return tf.no_op()

    def size(self):
        return self.rows.size()

    def row_bytes(self):
        """Bytes of this worker's keys and rows: 8 per key, 2 or 4 per value (slots are counted apart)."""
        return int(self.size()) * (8 + self.rows.value_dtype.size * self.dim)

    def export(self):
        """(keys int64 [K], rows float32 [K, dim]) held by this worker."""
        return self.rows.export()

    # --- change tracking (what a publish to serving reads: tf_fusedrec/train/publishing.py) ---------------------

    def changes(self):
        """(keys int64 [C], rows float32 [C, dim], removed int64 [R]) as NumPy: the keys inserted or written since
        the last clear_changes (a superset of those whose rows changed) with their rows, and the keys removed since
        then that this worker does not hold now. FailedPreconditionError before the first clear_changes."""
        keys, rows, _, removed = self.ops.native_table_changes(self.resource)
        return keys.numpy(), rows.numpy(), removed.numpy()

    def clear_changes(self):
        """Forgets the changes so far (the first call starts the tracking of removed keys)."""
        self.ops.native_table_clear_changes(self.resource)
