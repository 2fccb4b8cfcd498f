"""Embedding storage: one TFRA dynamic_embedding variable (a growing hash table) and its trainable shadow.

Each worker's table holds only the keys it owns (owner_of), so a layer's rows are sharded across workers, never
copied. New keys get the spec's initializer: Keras initializers are TFRA's default value; Hashed rows are computed
from (seed, feature, id) and inserted on the owner right before the lookup that first touches them.
"""

import collections

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import variable_scope
from tensorflow_recommenders_addons import dynamic_embedding as de

from tf_fusedrec import initializers


ShardedTable = collections.namedtuple("ShardedTable", ["name", "params", "trainable", "ids_of_keys"])
ShardedTable.__doc__ = """What a checkpoint needs of one sharded table: its name (equal on every worker), the TFRA
variable, the trainable handle the optimizer keys its slots by, and ids_of_keys(keys int64 numpy [K]) -> the id behind
each key (owner_of decides the owner from it), or None where the keys do not reveal the ids (hashed unified keys)."""


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


def check_table_name(name, owner):
    """TFRA's get_variable silently hands back an existing table of the same name: refuse instead, naming it.

    Table names derive from the layer's name (and the group's), so two layers of one name in one model (or process,
    until tf.keras.backend.clear_session()) would share rows. Every worker builds the same names."""
    scope = variable_scope.get_variable_scope()
    full_name = f"{scope.name}/{name}" if scope.name else name
    if full_name in variable_scope._get_default_variable_store()._vars:  # noqa: SLF001  (TFRA's own registry)
        raise ValueError(f"{owner}: an embedding table named '{full_name}' already exists in this process; give "
                         f"each embedding layer a distinct name (or build them in distinct "
                         f"tf.compat.v1.variable_scope's, or call tf.keras.backend.clear_session() between models)")
    return name


def insert_missing_rows(params, keys, rows_of_missing):
    """Inserts initial rows for the keys [U] (unique) that `params` does not hold yet.

    Args:
      params: a TFRA dynamic_embedding Variable.
      keys: int64 [U].
      rows_of_missing: function(bool mask [U]) -> float32 [number of True, dim], the rows of the missing keys.

    Returns:
      The upsert op.
    """
    _, exists = params.lookup(keys, return_exists=True)
    missing = tf.logical_not(exists)
    return params.upsert(tf.boolean_mask(keys, missing), rows_of_missing(missing))


class EmbeddingTable:
    """A sharded dynamic table of `dim`-wide float32 rows keyed by int64.

    Args:
      name: the table's name, derived from the layer's and the group's; must not be taken in this process.
      dim: row width.
      initializer: the spec's initializer.
      salts: for Hashed, the int64 feature_salt of each category (index = category); one entry for a per-feature
        table.
    """

    def __init__(self, name, dim, initializer, salts):
        self.name = check_table_name(name, f"table {name}")
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
        self._graph_trainables = []

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
          training: False for inference (nothing is inserted); None or True otherwise.
        """
        if ids is None:
            ids = keys
        if training is False:
            values, exists = self.params.lookup(keys, return_exists=True)
            if self.hashed:
                values = tf.where(exists[:, None], values, self.initial_rows(ids, categories))
            return values
        if not self.hashed:
            return self._trainable_lookup(keys)
        insert = insert_missing_rows(self.params, keys, lambda missing: self.initial_rows(
            tf.boolean_mask(ids, missing), None if categories is None else tf.boolean_mask(categories, missing)))
        with tf.control_dependencies([insert]):
            return self._trainable_lookup(tf.identity(keys))

    def size(self):
        return self.params.size()

    def export(self):
        """(keys int64 [K], rows float32 [K, dim]) held by this worker."""
        return self.params.export()
