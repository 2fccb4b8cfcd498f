"""The embedding-layer protocol: what the rest of the library may call on an embedding layer.

fr.train.make_optimizer (and its GroupedOptimizer), fr.train.Checkpointer, fr.export, the train app and the bench find
their embedding layers as instances of :class:`EmbeddingLayer` and call only the methods below. A layer implements
the required ones; the optional ones have the defaults of a layer without that feature (no replicated rows, nothing
to run after an update, no statistics), so callers never probe with ``hasattr``.

Implemented by FusedEmbedding, PerFeatureEmbedding and the bench's hand-fused TFRA strawman.

AutoGraph: the library's layers and models mark their ``call`` with :func:`unconverted`.
Their code holds no tensor-dependent Python control flow (TrainPipeline traces every step with autograph=False), so
inside a user's tf.function (or Keras' fit) AutoGraph has nothing to convert there; left to it, it converted their
code and, through it, tf_keras' own layer machinery (which TensorFlow's rules exempt as ``keras`` but not under the
name ``tf_keras``) at every process's first trace: 10 s of CPU for the GRM's first tf.function here
(benchmarks/results/tests/autograph.txt). What they call runs unconverted too (all the library's own layers); a user's model
around them is converted as Keras converts any subclassed layer.
"""

import tensorflow as tf


def unconverted(call):
    """A layer's ``call`` that AutoGraph leaves as it is (``tf.autograph.experimental.do_not_convert``), with the
    signature Keras reads from it (its ``training`` and ``mask`` arguments) kept: do_not_convert alone hands Keras a
    ``(*args, **kwargs)`` function, so Keras would pass ``training`` to every layer."""
    return tf.__internal__.decorator.make_decorator(call, tf.autograph.experimental.do_not_convert(call))


class EmbeddingLayer(tf.keras.layers.Layer):
    """Base class of the embedding layers. Subclasses set ``self.comm`` (the comm object their collectives use)."""

    # --- required -------------------------------------------------------------------------------------------------

    def optimizer_groups(self):
        """[(OptimizerSpec, [trainable variables])]: which optimizer updates which table variables."""
        raise NotImplementedError(f"{type(self).__name__}.optimizer_groups")

    def native_tables(self):
        """[NativeEmbeddingTable] whose updates the GroupedOptimizer applies in place ([] for TFRA tables)."""
        raise NotImplementedError(f"{type(self).__name__}.native_tables")

    def sharded_tables(self):
        """[ShardedTable] of this worker's shard of each table, in a deterministic order (checkpoints, export)."""
        raise NotImplementedError(f"{type(self).__name__}.sharded_tables")

    # --- optional, with the defaults of a layer without the feature ------------------------------------------------

    def replicated_tables(self):
        """[ReplicatedTable]: tables every worker holds a whole copy of (hot rows); saved once."""
        return []

    def access_tables(self):
        """Per sharded table (sharded_tables' order), the table object where it counts accesses for eviction or
        expiry, else None. fr.train.Checkpointer saves and restores through it: access_status() -> (keys, counts,
        lasts, clock), set_access_status(keys, counts, lasts, clock), and the int64 variables evicted and expired."""
        return [None] * len(self.sharded_tables())

    def replicated_variables(self):
        """Trainable handles whose gradients are averaged over the workers (replicated rows)."""
        return []

    def after_update(self, optimizer):  # noqa: ARG002
        """An op to run right after each update of `optimizer`, or None."""
        return None

    def statistics(self):
        """{feature name: {statistic: number}} for summaries ({} when the layer keeps none)."""
        return {}


def is_embedding_layer(obj):
    return isinstance(obj, EmbeddingLayer)
