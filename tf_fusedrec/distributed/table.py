"""Embedding storage: one TFRA dynamic_embedding variable (a growing hash table) and its trainable shadow.

Each worker's table holds only the keys it owns (owner_of), so a layer's rows are sharded across workers, never
copied. New keys get the spec's initializer: Keras initializers are TFRA's default value; Hashed rows are computed
from (seed, feature, id) and inserted on the owner right before the lookup that first touches them.

**float16 storage** (``EmbeddingTable(storage="float16")``, MTGRBoost §5.2's cold rows): the rows live in a float16
TFRA table (``store``: half the row bytes); the float32 table ``params`` holds only the rows in flight. A training
lookup copies the rows it reads from the store into ``params`` as float32 (staging), the step reads and updates them
there through the shadow with float32 optimizer math (the optimizer's slots are float32 tables keyed like
``params``), and ``commit(update_count)``, run by the GroupedOptimizer right after the update, rounds the updated
rows to float16 into the store and empties ``params``. An update is therefore the float32 update of the float32 value
of the stored row, rounded to float16 once: to the nearest, or stochastically (``rounding="stochastic"``,
tf_fusedrec/distributed/rounding.py: random bits of (salt, key, update count, column), as the native table's). Ids
never trained are not stored. Slots stay float32 (Adagrad's and Adam's accumulators underflow in float16). ``rows``
reads and writes the union as float32 (checkpoints, export, hot-set moves).
"""

import collections
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import variable_scope

from tf_fusedrec import _frameworks
from tf_fusedrec import initializers
from tf_fusedrec.distributed import admission as admission_lib
from tf_fusedrec.distributed import rounding as rounding_lib
from tf_fusedrec.ops import indexing

de = _frameworks.de  # TFRA's dynamic_embedding, imported on first use (_frameworks.tfra: an error saying how to get it)


ShardedTable = collections.namedtuple("ShardedTable", ["name", "params", "trainable", "ids_of_keys", "counts"],
                                      defaults=[None])
ShardedTable.__doc__ = """What a checkpoint needs of one sharded table: its name (equal on every worker), the TFRA
variable, the trainable handle the optimizer keys its slots by, ids_of_keys(keys int64 numpy [K]) -> the id behind
each key (owner_of decides the owner from it), or None where the keys do not reveal the ids (hashed unified keys), and
the AdmissionCounter of its keys not admitted yet (export, upsert; keyed like the rows), or None without admission."""


ReplicatedTable = collections.namedtuple("ReplicatedTable", ["name", "params", "trainable", "hot_set"])
ReplicatedTable.__doc__ = """A group's replicated hot rows (equal on every worker): its name, TFRA variable, trainable
handle and HotSet."""


def ids_are_keys(keys):
    return keys


def packed_ids(num_categories):
    """ids_of_keys for packed unified keys: the low 63 - b bits are the id."""
    from tf_fusedrec import ops  # noqa: PLC0415  (the op library loads lazily)

    mask = np.int64((1 << ops.packed_key_bits(num_categories)) - 1)
    return lambda keys: np.bitwise_and(np.asarray(keys, np.int64), mask)


# Names of the native tables made under each default graph, whose variable store is the registry TFRA's tables are in:
# native tables are not variables of that store, but their names must be as unique as TFRA's (checkpoints and exports
# key tables by name). Keyed weakly by the graph, so clear_session() (a new graph, a new store) forgets them as it
# forgets TFRA's.
_NATIVE_TABLE_NAMES = weakref.WeakKeyDictionary()


def scoped_table_name(name):
    """The table name with the variable scope it is made in (what TFRA names its variables; a native table's rows are
    named alike)."""
    scope = variable_scope.get_variable_scope()
    return f"{scope.name}/{name}" if scope.name else name


def check_table_name(name, owner, register=False):
    """Refuses a table name already taken in this process, naming it (TFRA's get_variable would silently hand back
    the existing table); `register`: takes the name for a native table.

    Table names derive from the layer's name (and the group's), so two layers of one name in one model (or process,
    until tf.keras.backend.clear_session()) would share rows (TFRA) or checkpoint files (native). Every worker builds
    the same names."""
    full_name = scoped_table_name(name)
    store = variable_scope._get_default_variable_store()  # noqa: SLF001  (TFRA's own registry)
    graph = tf.compat.v1.get_default_graph()
    if full_name in store._vars or full_name in _NATIVE_TABLE_NAMES.get(graph, ()):  # noqa: SLF001
        raise ValueError(f"{owner}: an embedding table named '{full_name}' already exists in this process; give "
                         f"each embedding layer a distinct name (or build them in distinct "
                         f"tf.compat.v1.variable_scope's, or call tf.keras.backend.clear_session() between models)")
    if register:
        _NATIVE_TABLE_NAMES.setdefault(graph, set()).add(full_name)
    return name


def insert_missing_rows(params, keys, rows_of_missing):
    """Inserts initial rows for the keys [U] (unique) that `params` does not hold yet.

    Args:
      params: a TFRA dynamic_embedding Variable.
      keys: int64 [U].
      rows_of_missing: function(int64 [M] positions in keys of the missing ones) -> float32 [M, dim], their rows.

    Returns:
      The upsert op.
    """
    _, exists = params.lookup(keys, return_exists=True)
    missing = indexing.true_positions(tf.logical_not(exists))
    return params.upsert(tf.gather(keys, missing), rows_of_missing(missing))


STORAGE_DTYPES = ("float32", "float16")


def check_storage(storage, owner):
    if storage not in STORAGE_DTYPES:
        raise ValueError(f"{owner}: storage must be one of {STORAGE_DTYPES}, got {storage!r}")
    return storage


class HalfRows:
    """The rows of a float16-storage table as one float32 table: the store's rows, overridden by the rows in flight
    in ``params`` (staged by a lookup, not yet committed). The subset of a TFRA variable's interface that
    checkpoints, export and hot-set moves use: lookup, upsert, remove, export, size, dim, name."""

    def __init__(self, params, store):
        self.params, self.store = params, store
        self.dim, self.name = params.dim, params.name

    def lookup(self, keys, return_exists=False):
        v32, e32 = self.params.lookup(keys, return_exists=True)
        v16, e16 = self.store.lookup(keys, return_exists=True)
        values = tf.where(tf.logical_and(tf.logical_not(e32), e16)[:, None], tf.cast(v16, tf.float32), v32)
        exists = tf.logical_or(e32, e16)
        return (values, exists) if return_exists else values

    def upsert(self, keys, rows):
        """Stores rows [K, dim] (rounded to float16) and drops any copy in flight."""
        keys = tf.convert_to_tensor(keys, tf.int64)
        put = self.store.upsert(keys, tf.cast(tf.convert_to_tensor(rows, tf.float32), tf.float16))
        with tf.control_dependencies([put]):
            return self.params.remove(tf.identity(keys))

    def remove(self, keys):
        keys = tf.convert_to_tensor(keys, tf.int64)
        return tf.group(self.store.remove(keys), self.params.remove(keys))

    def export(self):
        """(keys int64 [K], rows float32 [K, dim]): every stored row, the in-flight copy where there is one."""
        k32, v32 = self.params.export()
        k16, v16 = self.store.export()
        _, in_flight = self.params.lookup(k16, return_exists=True)
        keep = tf.logical_not(in_flight)
        k16, v16 = indexing.masked(keep, k16, v16)
        return tf.concat([k16, k32], 0), tf.concat([tf.cast(v16, tf.float32), v32], 0)

    def size(self):
        """Rows stored plus rows in flight: exact between steps (a step's commit empties params)."""
        return self.store.size() + self.params.size()


def row_bytes(rows):
    """Bytes of the keys and rows of a TFRA variable (float32) or a HalfRows: 8 per key, 4 per float32 value, 2 per
    float16 one; an int. Optimizer slots are separate TFRA variables (float32)."""
    if isinstance(rows, HalfRows):
        return row_bytes(rows.params) + int(rows.store.size()) * (8 + 2 * rows.dim)
    return int(rows.size()) * (8 + rows.value_dtype.size * rows.dim)


TABLE_BACKENDS = ("native", "tfra")


def check_table_backend(backend, owner):
    if backend not in TABLE_BACKENDS:
        raise ValueError(f"{owner}: table_backend must be one of {TABLE_BACKENDS}, got {backend!r}")
    return backend


def make_table(backend, name, dim, initializer, salts, optimizer, storage="float32", track_access=False,
               admission=None, rounding="nearest", tier=None):
    """A group's table on this worker: an EmbeddingTable (TFRA) or a NativeEmbeddingTable, with the same interface
    (name, dim, storage, trainable, rows, lookup, commit, evict, expire, size, row_bytes, export, admission).

    Args:
      backend: "native" or "tfra".
      optimizer: the group's OptimizerSpec (the native table keeps its slots beside the rows).
      track_access: count accesses for eviction and expiry (FusedEmbedding(eviction=..., expiry=...)).
      admission: None or an fr.Admission (tf_fusedrec/distributed/admission.py).
      rounding: "nearest" or "stochastic" (float16 storage only): how an updated row is rounded to float16.
      tier: None, or (fr.Tiered, rank): the native table keeps at most dram_bytes in DRAM, the rest on disk
        (tf_fusedrec/distributed/tier.py).
    """
    if tier is not None and backend != "native":
        raise ValueError(f"table {name}: tiered storage (tier=fr.Tiered(...)) needs table_backend='native', got "
                         f"{backend!r}")
    if check_table_backend(backend, f"table {name}") == "native":
        from tf_fusedrec.distributed.native_table import NativeEmbeddingTable  # noqa: PLC0415

        return NativeEmbeddingTable(name, dim, initializer, salts, optimizer, storage, track_access=track_access,
                                    admission=admission, rounding=rounding, tier=tier)
    table = EmbeddingTable(name, dim, initializer, salts, storage, admission=admission, rounding=rounding)
    if track_access:
        table.track_access()
    return table


def make_admission(admission, name):
    """The AdmissionCounter of a table with an fr.Admission, or None."""
    return None if admission is None else admission_lib.AdmissionCounter(name, admission.min_count)


class EmbeddingTable:
    """A sharded dynamic table of `dim`-wide rows keyed by int64, stored as float32 or float16 (module docstring).

    Args:
      name: the table's name, derived from the layer's and the group's; must not be taken in this process.
      dim: row width.
      initializer: the spec's initializer.
      salts: for Hashed, the int64 feature_salt of each category (index = category); one entry for a per-feature
        table.
      storage: "float32" or "float16".
      admission: None or an fr.Admission: keys get a row only once a training lookup has read them min_count times.
      rounding: "nearest" or "stochastic" (float16 storage only): how commit rounds the updated rows; stochastic
        rounding salts its random bits with salts[0].
    """

    def __init__(self, name, dim, initializer, salts, storage="float32", admission=None, rounding="nearest"):
        self.name = check_table_name(name, f"table {name}")
        self.storage = check_storage(storage, f"table {name}")
        rounding_lib.check_rounding(rounding, f"table {name}")
        if rounding == "stochastic" and self.storage != "float16":
            raise ValueError(f"table {name}: rounding stochastic needs storage float16 (float32 rows are not "
                             f"rounded), got {self.storage!r}")
        self.rounding = rounding_lib.make_rounding(rounding, salts[0])
        self.dim = dim
        self.initializer = initializer
        self.hashed = initializers.is_hashed(initializer)
        self._salts = tf.constant(salts, tf.int64)
        with tf.name_scope("FusedRecTable"):
            self.params = de.get_variable(
                self.name,
                key_dtype=tf.int64,
                value_dtype=tf.float32,
                dim=dim,
                initializer=initializers.tfra_initializer(initializer),
            )
            # TF2 (eager construction, tf.function steps): a ShadowVariable is the trainable handle. TFRA allows it
            # only in eager mode; in a tf.compat.v1 graph each lookup creates a TrainableWrapper instead.
            self.shadow = None
            if tf.executing_eagerly():
                self.shadow = de.shadow_ops.ShadowVariable(self.params, name=f"{self.name}-shadow", trainable=True)
            self.store = None
            self.rows = self.params
            if self.storage == "float16":
                if not tf.executing_eagerly():
                    raise ValueError(f"table {name}: float16 storage needs TF2 (eager construction, tf.function "
                                     f"steps); this is a tf.compat.v1 graph")
                self.store = de.get_variable(check_table_name(f"{self.name}/fp16", f"table {name}"),
                                             key_dtype=tf.int64, value_dtype=tf.float16, dim=dim,
                                             initializer=0.0, trainable=False)
                self.rows = HalfRows(self.params, self.store)
        self._graph_trainables = []
        self.status = None  # eviction and expiry (track_access): int64 [count, last] per key, and the lookups' clock
        self.admission = make_admission(admission, self.name)  # AdmissionCounter or None

    backend = "tfra"

    @property
    def trainable(self):
        """The handle the optimizer's slots and checkpoints key this table by (None in a tf.compat.v1 graph)."""
        return self.shadow

    @property
    def trainable_variables(self):
        """What the optimizer updates: the shadow, or (graph mode) the TrainableWrappers of the lookups so far."""
        return [self.shadow] if self.shadow is not None else list(self._graph_trainables)

    def _trainable_lookup(self, keys):
        if self.shadow is not None:
            return de.shadow_ops.embedding_lookup(self.shadow, keys)
        rows, trainable = de.embedding_lookup(self.params, keys, name=f"{self.name}-lookup", return_trainable=True)
        self._graph_trainables.append(trainable)
        return rows

    def initial_rows(self, ids, categories):
        """Hashed initial rows of ids [n] of categories int32 [n] (None: category 0)."""
        salts = self._salts[0] + tf.zeros_like(ids) if categories is None else tf.gather(self._salts, categories)
        return self.initializer.rows(ids, salts, self.dim)

    def lookup(self, keys, categories, ids, training):
        """Rows of unique keys [U] -> float32 [U, dim], trainable through the shadow unless training is False.

        Args:
          keys: int64 [U] unique table keys.
          categories: int32 [U] category of each key, or None (category 0: a per-feature table).
          ids: int64 [U] the id behind each key (Hashed initial rows are a function of (category, id)), or None when
            the keys are the ids.
          training: False for inference (nothing is inserted); None or True otherwise (with admission, only the
            admitted keys are inserted and trainable; the others read their initial rows).
        """
        if ids is None:
            ids = keys
        if training is False:
            values, exists = self.rows.lookup(keys, return_exists=True)
            if self.hashed:
                values = tf.where(exists[:, None], values, self.initial_rows(ids, categories))
            return values
        if self.admission is None:
            return self._training_lookup(keys, categories, ids)
        _, exists = self.rows.lookup(keys, return_exists=True)
        return admission_lib.admitted_lookup(keys, categories, ids, self.admission.admit(keys, exists),
                                             self._training_lookup, self._initial_lookup)

    def _initial_lookup(self, keys, categories, ids):
        """The rows keys [n] (not held) would start from: Hashed rows, or the TFRA default value."""
        return self.initial_rows(ids, categories) if self.hashed else self.params.lookup(keys)

    def _training_lookup(self, keys, categories, ids):
        """Rows of unique keys [U], inserted (Hashed) or staged (float16) and counted (track_access), read through
        the trainable handle."""
        def rows_of_missing(missing):
            return self.initial_rows(tf.gather(ids, missing),
                                     None if categories is None else tf.gather(categories, missing))

        insert = None
        if self.store is not None:
            insert = self._stage(keys, rows_of_missing if self.hashed else None)
        elif self.hashed:
            insert = insert_missing_rows(self.params, keys, rows_of_missing)
        if insert is not None:
            with tf.control_dependencies([insert]):
                keys = tf.identity(keys)
        if self.status is not None:
            with tf.control_dependencies([self._touch(keys)]):
                keys = tf.identity(keys)
        return self._trainable_lookup(keys)

    def _stage(self, keys, rows_of_missing=None):
        """float16 storage: puts into params, as float32, the stored rows of the keys [U] not in flight and, with
        rows_of_missing (Hashed: as insert_missing_rows takes it), the initial rows of the keys in neither; one
        upsert."""
        _, in_flight = self.params.lookup(keys, return_exists=True)
        stored, exists = self.store.lookup(keys, return_exists=True)
        rows = tf.cast(stored, tf.float32)
        if rows_of_missing is None:
            take = tf.logical_and(exists, tf.logical_not(in_flight))
        else:
            take = tf.logical_not(in_flight)
            fresh = tf.where(tf.logical_and(take, tf.logical_not(exists)))
            rows = tf.tensor_scatter_nd_update(rows, fresh, rows_of_missing(tf.reshape(fresh, [-1])))
        return self.params.upsert(*indexing.masked(take, keys, rows))

    def track_access(self):
        """Starts counting accesses for eviction and expiry (tf_fusedrec/distributed/eviction.py, admission.py): a
        status table beside the rows and the lookups' clock. Call once, before the first lookup."""
        if self.status is None:
            if not tf.executing_eagerly():
                raise ValueError(f"table {self.name}: eviction and expiry need TF2 (eager construction, tf.function "
                                 f"steps)")
            with tf.name_scope("FusedRecTable"):
                self.status = de.get_variable(check_table_name(f"{self.name}/status", f"table {self.name}"),
                                              key_dtype=tf.int64, value_dtype=tf.int64, dim=2, initializer=0,
                                              trainable=False)
            prefix = self.name.replace("/", "_")
            self.clock = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{prefix}_clock")
            self.evicted = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{prefix}_evicted")
            self.expired = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{prefix}_expired")

    def _touch(self, keys):
        """count += 1 and last = the new clock for the unique keys [U] of a training lookup."""
        clock = self.clock.assign_add(1)
        status = self.status.lookup(keys)
        new = tf.stack([status[:, 0] + 1, tf.fill(tf.shape(keys), clock)], axis=1)
        return self.status.upsert(keys, new)

    def evict(self, capacity, policy, slots=()):
        """Removes the rows over `capacity` by `policy` with their slots (TFRA variables keyed like the rows) and
        status; -> the number of keys evicted so far (an int64 tensor)."""
        from tf_fusedrec.distributed import eviction  # noqa: PLC0415

        return self._remove_by_status(
            lambda keys, counts, lasts, clock: eviction.victims(keys, counts, lasts, clock, capacity, policy),
            self.evicted, slots)

    def expire(self, steps, slots=()):
        """Removes the rows no training lookup has read in the last `steps` lookups, with their slots and status
        (tf_fusedrec/distributed/admission.py); -> the number of keys expired so far (an int64 tensor)."""
        return self._remove_by_status(
            lambda keys, counts, lasts, clock: admission_lib.expired(keys, lasts, clock, steps), self.expired, slots)

    def _remove_by_status(self, select, counter, slots):
        """Removes the keys select(keys, counts, lasts, clock) picks, with their rows, slots and status, and adds
        their number to `counter`."""
        keys = self.rows.export()[0]
        # [0, 0] for a row never counted (restored from a checkpoint without status, or moved from the hot set)
        status = self.status.lookup(keys)
        gone = select(keys, status[:, 0], status[:, 1], self.clock.read_value())
        removed = [self.rows.remove(gone), self.status.remove(gone)] + [slot.remove(gone) for slot in slots]
        with tf.control_dependencies(removed):
            return counter.assign_add(tf.size(gone, out_type=tf.int64))

    def access_status(self):
        """(keys int64 [K], counts int64 [K], lasts int64 [K], clock int64 scalar): the status of every key counted
        (track_access) and the lookups' clock; what checkpoints save (tf_fusedrec/train/checkpoint.py)."""
        keys, status = self.status.export()
        return keys, status[:, 0], status[:, 1], self.clock.read_value()

    def set_access_status(self, keys, counts, lasts, clock):
        """Sets the status of keys int64 [K] to (counts, lasts) int64 [K] and the clock to `clock` (a checkpoint's
        restore); other keys keep theirs."""
        keys = tf.convert_to_tensor(keys, tf.int64)
        status = tf.stack([tf.convert_to_tensor(counts, tf.int64), tf.convert_to_tensor(lasts, tf.int64)], axis=1)
        with tf.control_dependencies([self.status.upsert(keys, status)]):
            return self.clock.assign(tf.convert_to_tensor(clock, tf.int64))

    def commit(self, update_count=None):
        """float16 storage: rounds the rows in flight (read, and updated, by this step) into the store and empties
        params. Run after the update (fr.train's GroupedOptimizer does) with the group optimizer's 1-based number of
        that update (int64 scalar; stochastic rounding draws its bits from it, nearest ignores it); a no-op for
        float32 storage. A row already a float16 value is stored unchanged either way."""
        if self.store is None:
            return tf.no_op()
        if update_count is None and self.rounding.name == "stochastic":
            raise ValueError(f"table {self.name}: stochastic rounding needs the update count of the commit")
        keys, rows = self.params.export()
        put = self.store.upsert(keys, self.rounding.to_float16(rows, keys, update_count))
        with tf.control_dependencies([put]):
            return self.params.remove(tf.identity(keys))

    def size(self):
        return self.rows.size()

    def row_bytes(self):
        """Bytes of this worker's keys and rows (row_bytes)."""
        return row_bytes(self.rows)

    def export(self):
        """(keys int64 [K], rows float32 [K, dim]) held by this worker."""
        return self.rows.export()
