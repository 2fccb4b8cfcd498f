"""The native table backend: one C++ hash table per group (cc/kernels/native_table_op.cc), rows and optimizer slots
side by side, a training lookup that initialises missing keys in the same probe, and the sparse optimizer applied in
place (``FusedEmbedding(table_backend="native")``).

Against the TFRA backend (tf_fusedrec/distributed/table.py) a training step saves, per key: the existence lookup and
upsert of Hashed initial rows, the ShadowVariable's copy of the step's rows, and the optimizer's two finds and two
upserts (rows and each slot); what is left is one probe to read and one probe to update.

How the gradient reaches the table: the trainable handle is a one-element ``tf.Variable`` (``anchor``) that the
lookup reads under a ``tf.custom_gradient``; its gradient is an ``IndexedSlices`` whose indices are the table keys of
the step and whose values are their rows' gradients. fr.train.GroupedOptimizer recognises the anchor and calls
:meth:`NativeEmbeddingTable.apply_gradients` with the group's current learning rate and update number, which runs
the group's optimizer in place (sgd with or without momentum, adagrad, adam, adamw, ftrl, rmsprop with TensorFlow's
update formulas, lazily: native_table_ops.native_table_apply_sparse); its other hyperparameters are the table's, from
the group's OptimizerSpec. No copy of the rows is kept between the lookup and the update.

Checkpoints, export and the summary reach the rows and each optimizer slot through :class:`NativeRows` views, which
offer the subset of a TFRA variable's interface they use (lookup, upsert, remove, export, size, dim, name), so a
checkpoint written with one backend restores into the other (slots match by their TFRA names).
"""

import numpy as np
import tensorflow as tf

from tf_fusedrec import _keras
from tf_fusedrec import initializers
from tf_fusedrec.distributed import admission as admission_lib
from tf_fusedrec.distributed.table import check_storage, check_table_name, make_admission, scoped_table_name

NATIVE_OPTIMIZERS = ("sgd", "adagrad", "adam", "adamw", "ftrl", "rmsprop")
# What an OptimizerSpec's config may hold for the native update, per optimizer: the learning rate (each update's) and
# the hyperparameters the table holds (native_table_ops.HYPERPARAMETERS: Keras 3's names and defaults). Anything
# else (clipnorm, weight_decay other than AdamW's, ...) is refused.
_SUPPORTED_CONFIG = {
    "sgd": {"learning_rate", "momentum", "nesterov"},
    "adagrad": {"learning_rate", "initial_accumulator_value", "epsilon"},
    "adam": {"learning_rate", "beta_1", "beta_2", "epsilon", "amsgrad"},
    "adamw": {"learning_rate", "beta_1", "beta_2", "epsilon", "weight_decay", "amsgrad"},
    "ftrl": {"learning_rate", "learning_rate_power", "initial_accumulator_value", "l1_regularization_strength",
             "l2_regularization_strength", "l2_shrinkage_regularization_strength", "beta"},
    "rmsprop": {"learning_rate", "rho", "momentum", "epsilon", "centered"},
}


def check_native_spec(optimizer_spec, initializer, owner):
    """Refuses, naming `owner` (layer and group), an optimizer, hyperparameter or initializer the native table does
    not implement."""
    table_hyperparameters(optimizer_spec, owner)
    _initializer_attrs(initializer, owner)


def table_hyperparameters(optimizer_spec, owner):
    """The table's hyperparameters of an OptimizerSpec (its config without the learning rate, which comes with each
    update), checked: ValueError naming `owner` for an optimizer the native table does not implement, a setting it
    does not implement (amsgrad=True, gradient clipping, ...) or a bad value."""
    from tf_fusedrec.ops import native_table_ops  # noqa: PLC0415  (the op library loads lazily)

    name = optimizer_spec.name
    if name not in NATIVE_OPTIMIZERS:
        raise ValueError(f"{owner}: table_backend='native' implements the optimizers {NATIVE_OPTIMIZERS}, the group "
                         f"uses {name!r}; use table_backend='tfra' for it")
    config = dict(optimizer_spec.config)
    extra = sorted(set(config) - _SUPPORTED_CONFIG[name])
    if extra:
        raise ValueError(f"{owner}: table_backend='native' implements {name} with {sorted(_SUPPORTED_CONFIG[name])}; "
                         f"got also {extra}")
    if config.pop("amsgrad", False):
        raise ValueError(f"{owner}: table_backend='native' implements {name} without amsgrad; got amsgrad=True")
    config.pop("learning_rate", None)

    def fail(message):
        raise ValueError(f"{owner}: {message}")

    native_table_ops.check_hyperparameters(name, config, fail)  # the table's own checks, naming owner
    return config


# Keras' random initializers (Keras 3's keras.initializers and tf_keras' classes, by class name) and the create op's
# init of each: the row is drawn from a stream of (seed, category salt, id), so it never depends on the order or the
# worker a key arrives on. Their distributions, not their values: Keras draws from a per-call random op.
_RANDOM_INITIALIZERS = {"RandomNormal": "normal", "TruncatedNormal": "truncated_normal", "RandomUniform": "uniform"}


def _initializer_attrs(initializer, owner):
    """The create op's initializer attributes of a spec's initializer: Hashed, a Keras Zeros/Ones/Constant(scalar), or
    a Keras RandomNormal(mean, stddev, seed) / TruncatedNormal(mean, stddev, seed) / RandomUniform(minval, maxval,
    seed), whose int seed picks the stream (seed None is seed 0: the rows are reproducible either way)."""
    if initializers.is_hashed(initializer):
        return {"init": "hashed", "seed": initializer.seed, "stddev": initializer.stddev}
    config = initializer.get_config() if hasattr(initializer, "get_config") else {}
    kind = type(initializer).__name__
    if kind == "Zeros":
        return {"init": "constant", "value": 0.0}
    if kind == "Ones":
        return {"init": "constant", "value": 1.0}
    if kind == "Constant" and _is_number(config.get("value")):
        return {"init": "constant", "value": float(config["value"])}
    if kind in _RANDOM_INITIALIZERS:
        params = ("minval", "maxval") if kind == "RandomUniform" else ("mean", "stddev")
        seed = config.get("seed")
        if all(_is_number(config.get(p)) for p in params) and (seed is None or _is_int(seed)):
            attrs = {"init": _RANDOM_INITIALIZERS[kind], "seed": 0 if seed is None else int(seed)}
            attrs.update({p: float(config[p]) for p in params})
            if kind == "RandomUniform" and not attrs["minval"] < attrs["maxval"]:
                raise ValueError(f"{owner}: RandomUniform needs minval < maxval, got {attrs['minval']} and "
                                 f"{attrs['maxval']}")
            if kind != "RandomUniform" and not attrs["stddev"] > 0:
                raise ValueError(f"{owner}: {kind} needs stddev > 0, got {attrs['stddev']}")
            return attrs
    raise ValueError(f"{owner}: table_backend='native' initialises new rows with fr.initializers.Hashed, a Keras "
                     f"Zeros/Ones/Constant(scalar) or a Keras RandomNormal/TruncatedNormal/RandomUniform with scalar "
                     f"parameters and an int or None seed; got {initializer!r}; use table_backend='tfra' for it")


def _is_number(x):
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _is_int(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


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
        keys, values = tf.convert_to_tensor(keys, tf.int64), tf.convert_to_tensor(values, tf.float32)
        chunk = self._table.upsert_chunk()
        if chunk is None or not tf.executing_eagerly() or int(tf.size(keys)) <= chunk:
            return self._table.ops.native_table_upsert(self._table.resource, keys, values, part=self.part)
        # A tiered table holds at most its DRAM capacity of one call's keys: a restore's upserts go in chunks.
        for start in range(0, int(tf.size(keys)), chunk):
            self._table.ops.native_table_upsert(self._table.resource, keys[start:start + chunk],
                                                values[start:start + chunk], part=self.part)
        return None

    def remove(self, keys):
        """Removes whole keys (the row and every slot: they live together)."""
        return self._table.ops.native_table_remove(self._table.resource, tf.convert_to_tensor(keys, tf.int64))

    def export(self):
        """(keys int64 [K], values float32 [K, dim]) of this part."""
        keys, rows, slots = self._table.ops.native_table_export(self._table.resource)
        return keys, (rows if self.part == 0 else slots[:, self.part - 1])

    def size(self):
        return self._table.ops.native_table_size(self._table.resource)

    def entry_bytes(self):
        """Bytes an export gives per key: the key, the row and every slot as float32, and the access stats."""
        return 8 + 4 * self.dim * (1 + len(self._table.slots())) + 16

    def export_chunks(self, max_rows):
        """Yields the whole table (rows and every slot, whichever part this is) as chunks of at most max_rows keys:
        (keys int64 [k], rows float32 [k, dim], slots float32 [k, S, dim] in the table's slot order (NativeRows.part
        - 1), counts int64 [k], lasts int64 [k] (access stats; zeros where the table keeps none), the table's clock),
        as NumPy. What
        checkpoints a table larger than memory with; the table must not change until the last chunk, and the chunks'
        keys add up to size() (a ValueError naming the table otherwise)."""
        ops, resource = self._table.ops, self._table.resource
        size = int(self.size())
        cursor, total = ops.EXPORT_START, 0
        while tuple(cursor) != ops.EXPORT_DONE:
            chunk = ops.native_table_export_chunk(resource, cursor, max_rows)
            cursor = tuple(chunk.next.numpy().tolist())
            keys = chunk.keys.numpy()
            total += len(keys)
            if total > size:
                break
            if len(keys):
                yield (keys, chunk.rows.numpy(), chunk.slots.numpy(), chunk.counts.numpy(), chunk.last.numpy(),
                       chunk.clock.numpy())
        if total != size:
            raise ValueError(f"native table {self._table.name}: its export in chunks gave {total} keys, the table "
                             f"holds {size}: it changed during the export")


class NativeEmbeddingTable:
    """A sharded table of `dim`-wide rows keyed by int64 with the group's optimizer slots beside each row.

    Args:
      name: the table's name, derived from the layer's and the group's (must be unique in the process).
      dim: row width.
      initializer: the spec's initializer (Hashed, a Keras Zeros/Ones/Constant, or a Keras RandomNormal /
        TruncatedNormal / RandomUniform: _initializer_attrs).
      salts: the int64 feature_salt of each category (index = category): the Hashed rows' and the random
        initializers' stream of a category.
      optimizer: the group's OptimizerSpec (NATIVE_OPTIMIZERS): its hyperparameters other than the learning rate are
        the table's (Keras 3's names and defaults, native_table_ops.HYPERPARAMETERS), and decide the slots.
      storage: "float32" or "float16" (rows stored as float16, read as float32, each update computed in float32
        and rounded once; slots stay float32). A new key's initial row is rounded when it is inserted, where the TFRA
        backend keeps it float32 until the key's first update: the two agree to one float16 rounding, not bit for
        bit (an update's rounding is bit for bit the TFRA backend's, nearest or stochastic).
      rounding: "nearest" or "stochastic" (float16 storage only): how an update's row is rounded to float16
        (tf_fusedrec/distributed/rounding.py).
      track_access: count each training lookup's keys (count, last clock) in the table, for eviction and expiry.
      admission: None or an fr.Admission: keys get a row only once a training lookup has read them min_count times
        (tf_fusedrec/distributed/admission.py).
      tier: None (all rows in DRAM) or (fr.Tiered, rank): at most dram_bytes of entries in DRAM, the others in a
        store on disk (tf_fusedrec/distributed/tier.py); trains exactly as the all-DRAM table.
    """

    backend = "native"

    def __init__(self, name, dim, initializer, salts, optimizer, storage="float32", track_access=False,
                 admission=None, rounding="nearest", tier=None):
        from tf_fusedrec.ops import native_table_ops  # noqa: PLC0415  (the op library loads lazily)

        self.ops = native_table_ops
        self.name, self.dim, self.initializer = check_table_name(name, f"table {name}", register=True), dim, initializer
        self._lookup_keys = None  # the keys tensor of the last training lookup (_trainable; apply_gradients)
        self.storage = check_storage(storage, f"table {name}")
        hyperparameters = table_hyperparameters(optimizer, f"table {name}")
        self.optimizer = optimizer
        self.tier = None if tier is None else tier[0]
        tier_attrs = {} if tier is None else {"tier_path": tier[0].table_path(name, tier[1]),
                                              "tier_dram_bytes": tier[0].dram_bytes}
        self.resource = native_table_ops.NativeTableResource(
            name=name, dim=dim, optimizer=optimizer.name, hyperparameters=hyperparameters, storage=self.storage,
            salts=[int(s) for s in salts], track_access=track_access, rounding=rounding, **tier_attrs,
            **_initializer_attrs(initializer, f"table {name}"))
        self._slot_names = self.resource.slot_names
        prefix = name.replace("/", "_")
        # The trainable handle: its gradient is IndexedSlices(rows' gradients, table keys) (module docstring).
        # A keras.Variable under Keras 3 (which tracks no plain tf.Variable as a layer weight), a tf.Variable under
        # tf_keras: either way in the layer's trainable_weights, so model.fit and custom loops compute its gradient.
        # Who applies the update: a GroupedOptimizer (fr.train.make_optimizer) claims the table and receives the rows'
        # gradient as IndexedSlices. An unclaimed table with a pending_update (FusedEmbedding sets one) trains under
        # any Keras optimizer: the backward pass keeps the rows' gradient here (pending), the anchor's gradient is a
        # zero (which moves no optimizer's zero variable), and the anchor's constraint, which every Keras optimizer
        # (Keras 3, tf_keras' and its legacy ones) runs right after applying a step's gradients, applies the pending
        # gradient with the group's optimizer (apply_pending). The table changes when the optimizer steps, not when
        # a gradient is computed; the last gradient computed before a step is the one applied.
        self.claimed = False
        self.pending_update = None
        self._pending_keys = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False,
                                         name=f"{prefix}_pending_keys")
        # Whether the pending gradient is yet to be applied. A flag, not emptied variables: assigning an empty tensor
        # in the step's graph made TensorFlow's graph optimisation fold the size of the forward pass's keys to 0.
        self._pending = tf.Variable(False, trainable=False, name=f"{prefix}_pending")
        self._pending_grads = tf.Variable(tf.zeros([0, dim], tf.float32), shape=tf.TensorShape([None, dim]),
                                          trainable=False, name=f"{prefix}_pending_grads")
        self.anchor = _keras.variable(tf.zeros([1]), name=f"{prefix}_native_anchor", constraint=self.apply_pending)
        self.rows = NativeRows(self, 0, scoped_table_name(name))
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
            _keras.read(anchor)  # the tape records the anchor as used here, and hands its gradient to grad

            def grad(upstream, variables=None):
                slices = tf.IndexedSlices(upstream, keys, tf.constant([1, self.dim], tf.int64))
                if self.claimed or self.pending_update is None:
                    return None, [slices] * len(variables or [])
                # Unclaimed: kept until the optimizer's step applies it (apply_pending); the anchor's gradient is 0.
                kept = [self._pending_keys.assign(keys), self._pending_grads.assign(upstream),
                        self._pending.assign(True)]
                with tf.control_dependencies(kept):
                    zero = tf.zeros([1], tf.float32)
                return None, [zero] * len(variables or [])

            return tf.identity(rows), grad

        return attach(rows)

    def apply_pending(self, anchor):
        """The anchor's constraint: applies the pending gradient (the last backward pass's) with pending_update and
        empties it; returns the anchor's value (zeros: nothing else ever changes it). A no-op while claimed."""
        if self.claimed or self.pending_update is None:
            return _keras.read(anchor)
        def apply():
            update = self.pending_update(tf.IndexedSlices(self._pending_grads.read_value(),
                                                          self._pending_keys.read_value(),
                                                          tf.constant([1, self.dim], tf.int64)))
            with tf.control_dependencies([update] if update is not None else []):
                cleared = self._pending.assign(False, read_value=False)
            with tf.control_dependencies([cleared] if cleared is not None else []):
                return tf.constant(True)

        done = tf.cond(self._pending.read_value(), apply, lambda: tf.constant(False))
        with tf.control_dependencies([done]):
            return tf.zeros([1], tf.float32)

    def apply_gradients(self, grad, learning_rate, update_count):
        """Applies the group's optimizer (its OptimizerSpec's, with the table's hyperparameters) in place to the rows
        of grad; -> the update op.

        Args:
          grad: IndexedSlices from the anchor: values float32 [U, dim], indices the table keys int64 [U].
          learning_rate: float32 scalar tensor, the group's current learning rate (any schedule already evaluated).
          update_count: int64 scalar tensor, this group's 1-based update number (the caller advances it once per step
            for all of the group's tables): Adam's and AdamW's bias correction, and stochastic rounding's bits.
        """
        values = tf.convert_to_tensor(grad.values, tf.float32)
        keys = tf.convert_to_tensor(grad.indices, tf.int64)
        learning_rate = tf.cast(learning_rate, tf.float32)
        update_count = tf.cast(update_count, tf.int64)
        # Keys the step's lookup inserted: categories and ids only matter for a key missing here, which is none.
        distinct = grad.indices is self._lookup_keys  # never None: a gradient has indices
        return self.ops.native_table_apply_sparse(self.resource, keys, values, tf.zeros_like(keys, tf.int32), keys,
                                                  learning_rate, update_count=update_count, distinct_keys=distinct)

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

    def upsert_chunk(self):
        """The most keys one upsert of a tiered table takes (half its DRAM capacity), or None (all-DRAM)."""
        if self.tier is None:
            return None
        capacity = int(self.ops.native_table_tier_stats(self.resource)[2])
        return max(1, capacity // 2)

    def tier_stats(self):
        """{name: int} of native_table_ops.TIER_STATS: rows in DRAM and on disk, DRAM capacity (-1: all-DRAM) and
        bytes, and since creation the training lookups' keys found in DRAM (hits), on disk, in neither (new), rows
        evicted, bytes read from and written to disk."""
        values = self.ops.native_table_tier_stats(self.resource).numpy().tolist()
        return dict(zip(self.ops.TIER_STATS, values))

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
