"""PerFeatureEmbedding: the baseline, one TFRA HvdAllToAllEmbedding per feature, kept for comparison.

This is what a TFRA user writes today: per feature and step, a unique, a keys all-to-all, a second unique on the
owner and an embeddings all-to-all. Inputs, outputs, combiners, sharding (owner_of) and initial rows are the same
as FusedEmbedding's, so the two can be compared number for number.
"""

import re

import tensorflow as tf
from tensorflow_recommenders_addons import dynamic_embedding as de
from tensorflow_recommenders_addons.dynamic_embedding.python.ops.shadow_embedding_ops import HvdVariable

from tf_fusedrec import config as cfg
from tf_fusedrec import initializers
from tf_fusedrec import ops
from tf_fusedrec.distributed import comm as comm_lib
from tf_fusedrec.distributed.table import insert_missing_rows, unique_table_name
from tf_fusedrec.layers import _common
from tf_fusedrec.layers import _inputs


def scope_safe(name):
    """A name TensorFlow accepts as a name scope (TFRA's layers open one with their name): other characters -> '_'."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name)


def owner_partition(keys, num_ranks):
    """TFRA partition_fn routing each id to owner_of(id): the same sharding as FusedEmbedding."""
    return ops.owner_of(tf.reshape(keys, [-1]), num_ranks) if num_ranks > 1 else tf.zeros_like(keys, tf.int32)


class _HashedInitHvdVariable(HvdVariable):
    """TFRA's HvdVariable with Hashed initial rows inserted on the owner, right after the keys all-to-all."""

    def __init__(self, rows_of_ids, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._rows_of_ids = rows_of_ids

    def __relocate_dense_feature__(self, ids):
        received, remote_sizes, indices = super().__relocate_dense_feature__(ids)
        unique_ids, _ = tf.unique(received)
        insert = insert_missing_rows(
            self.shadow.params, unique_ids, lambda missing: self._rows_of_ids(tf.boolean_mask(unique_ids, missing))
        )
        with tf.control_dependencies([insert]):
            return tf.identity(received), remote_sizes, indices


@tf.keras.utils.register_keras_serializable(package="FusedRec")
class PerFeatureEmbedding(tf.keras.layers.Layer):
    """One TFRA HvdAllToAllEmbedding per feature (the baseline). Same arguments and call as FusedEmbedding."""

    def __init__(self, features, optimizer=_common.DEFAULT_OPTIMIZER, initializer=None, comm=None, name=None,
                 **kwargs):
        super().__init__(name=name, **kwargs)
        self.features = _common.parse_features(features, self.name)
        self.default_optimizer = cfg.optimizer_spec(optimizer, f"{self.name}: optimizer")
        self.default_initializer = initializers.get(initializer) or _common.default_initializer()
        self.comm = comm_lib.get_comm(comm)
        self._layers, self._optimizers, self._initializers = {}, {}, {}
        for f in sorted(self.features, key=lambda f: f.name):
            initializer = f.initializer if f.initializer is not None else self.default_initializer
            self._initializers[f.name] = initializer
            self._optimizers[f.name] = f.optimizer if f.optimizer is not None else self.default_optimizer
            layer = de.keras.layers.HvdAllToAllEmbedding(
                embedding_size=f.dim,
                key_dtype=tf.int64,
                initializer=initializers.tfra_initializer(initializer),
                name=unique_table_name(scope_safe(f"{self.name}-{f.name}")),
                mpi_size=self.comm.size,
                partitioner=owner_partition,
            )
            if initializers.is_hashed(initializer):
                salt = initializers.feature_salt(initializer.seed, f.name)
                rows = self._hashed_rows(initializer, salt, f.dim)
                layer.hvd_variable = _HashedInitHvdVariable(
                    rows, layer.name, layer.shadow, f.dim, mpi_size=self.comm.size
                )
            self._layers[f.name] = layer
        self._shadows = [self._layers[n].shadow for n in sorted(self._layers)]
        self._table_params = [self._layers[n].params for n in sorted(self._layers)]

    @staticmethod
    def _hashed_rows(initializer, salt, dim):
        return lambda ids: initializer.rows(ids, tf.fill(tf.shape(ids), tf.constant(salt, tf.int64)), dim)

    @property
    def groups(self):
        """One group per feature: the baseline fuses nothing."""
        groups, _ = cfg.group_features(self.features, self.default_optimizer, self.default_initializer)
        return [
            cfg.SpecGroup(g.spec, (n,), i, g.encoding)
            for i, (g, n) in enumerate(sorted(((g, n) for g in groups for n in g.feature_names), key=lambda x: x[1]))
        ]

    def optimizer_groups(self):
        return [(self._optimizers[n], [self._layers[n].shadow]) for n in sorted(self._layers)]

    def embedding_variables(self):
        return [self._layers[n].shadow for n in sorted(self._layers)]

    def tfra_layer(self, feature_name):
        return self._layers[feature_name]

    def call(self, inputs, training=None):
        flats, checks = _common.flatten_inputs(self.features, inputs, self.name)
        outputs = {}
        with tf.control_dependencies(checks):
            for name in sorted(self._layers):
                feature, layer = next(f for f in self.features if f.name == name), self._layers[name]
                ids = tf.identity(flats[name].ids)
                initializer = self._initializers[name]
                if training is False:
                    values, exists = layer.params.lookup(ids, return_exists=True)
                    if initializers.is_hashed(initializer):
                        salt = initializers.feature_salt(initializer.seed, name)
                        fresh = self._hashed_rows(initializer, salt, feature.dim)(ids)
                        values = tf.where(exists[:, None], values, fresh)
                    rows = values
                else:
                    if self.comm.size == 1 and initializers.is_hashed(initializer):
                        # TFRA skips the relocation with one worker: insert here, where the ids are local.
                        salt = initializers.feature_salt(initializer.seed, name)
                        unique_ids, _ = tf.unique(ids)
                        fresh = self._hashed_rows(initializer, salt, feature.dim)
                        insert = insert_missing_rows(
                            layer.params, unique_ids, lambda m: fresh(tf.boolean_mask(unique_ids, m))
                        )
                        ids = _common.after([insert], ids)
                    rows = layer(ids)
                outputs[name] = _inputs.unflatten_rows(feature, rows, flats[name].layout)
        return outputs

    def get_config(self):
        config = super().get_config()
        config.update(_common.layer_config(self.features, self.default_optimizer, self.default_initializer))
        return config
