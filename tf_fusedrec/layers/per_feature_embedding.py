"""PerFeatureEmbedding: the baseline, one TFRA HvdAllToAllEmbedding per feature, kept for comparison.

This is what a TFRA user writes today: per feature and step, a unique, a keys all-to-all, a second unique on the
owner and an embeddings all-to-all. Inputs, outputs, combiners, sharding (owner_of) and initial rows are the same
as FusedEmbedding's, so the two can be compared number for number.
"""

import functools
import re

import tensorflow as tf

from tf_fusedrec import _frameworks
from tf_fusedrec import config as cfg
from tf_fusedrec import initializers
from tf_fusedrec import ops
from tf_fusedrec.distributed import comm as comm_lib
from tf_fusedrec.distributed.table import ShardedTable, check_table_name, ids_are_keys, insert_missing_rows
from tf_fusedrec.layers import _common
from tf_fusedrec.layers import _inputs
from tf_fusedrec.layers.protocol import EmbeddingLayer, unconverted

de = _frameworks.de  # TFRA's dynamic_embedding, imported on first use (_frameworks.tfra: an error saying how to get it)


def _hvd_variable_class():
    """TFRA's HvdVariable (imported when the first TFRA layer is built: the class is TFRA's, in the [tfra] extra)."""
    _frameworks.tfra()
    from tensorflow_recommenders_addons.dynamic_embedding.python.ops.shadow_embedding_ops import (  # noqa: PLC0415
        HvdVariable)

    return HvdVariable


def scope_safe(name):
    """A name TensorFlow accepts as a name scope (TFRA's layers open one with their name): other characters -> '_'."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name)


def owner_partition(keys, num_ranks):
    """TFRA partition_fn routing each id to owner_of(id): the same sharding as FusedEmbedding."""
    return ops.owner_of(tf.reshape(keys, [-1]), num_ranks) if num_ranks > 1 else tf.zeros_like(keys, tf.int32)


@functools.lru_cache(maxsize=None)
def _hashed_init_hvd_variable_class():
    """TFRA's HvdVariable with Hashed initial rows inserted on the owner, right after the keys all-to-all (a subclass
    made on first use, since its base is TFRA's)."""

    class HashedInitHvdVariable(_hvd_variable_class()):
        def __init__(self, rows_of_ids, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._rows_of_ids = rows_of_ids

        def __relocate_dense_feature__(self, ids):
            received, remote_sizes, indices = super().__relocate_dense_feature__(ids)
            unique_ids, _ = tf.unique(received)
            insert = insert_missing_rows(
                self.shadow.params, unique_ids, lambda missing: self._rows_of_ids(tf.gather(unique_ids, missing))
            )
            with tf.control_dependencies([insert]):
                return tf.identity(received), remote_sizes, indices

    return HashedInitHvdVariable


class TFRACommAdapter:
    """What TFRA's HvdVariable calls as `hvd`: its two all-to-alls go through our comm object (so a MeteredComm
    counts them) with fixed names, instead of through Horovod directly."""

    def __init__(self, comm, prefix):
        self.comm, self.prefix = comm, prefix

    def alltoall(self, tensor, splits=None, name=None):  # noqa: ARG002  (TFRA passes no name)
        kind = "embeddings" if tensor.dtype.is_floating else "keys"
        return self.comm.alltoall(tensor, splits, name=f"{self.prefix}/{kind}")

    def size(self):
        return self.comm.size

    def rank(self):
        return self.comm.rank


def make_tfra_layer(name, dim, initializer, salt_key, comm):
    """One TFRA HvdAllToAllEmbedding sharded by owner_of. With a Hashed initializer, new rows are inserted on the owner
    right after the keys all-to-all, salted by feature_salt(seed, salt_key).

    Returns:
      (layer, rows_of_ids): rows_of_ids(ids int64 [n]) -> the Hashed initial rows, or None for other initializers.
    """
    layer = de.keras.layers.HvdAllToAllEmbedding(
        embedding_size=dim,
        key_dtype=tf.int64,
        initializer=initializers.tfra_initializer(initializer),
        name=check_table_name(scope_safe(name), f"layer {name}"),
        mpi_size=comm.size,
        partitioner=owner_partition,
    )
    adapter = TFRACommAdapter(comm, f"FusedRec/{scope_safe(name)}")
    layer.hvd_variable.hvd = adapter
    if not initializers.is_hashed(initializer):
        return layer, None
    salt = tf.constant(initializers.feature_salt(initializer.seed, salt_key), tf.int64)

    def rows_of_ids(ids):
        return initializer.rows(ids, tf.fill(tf.shape(ids), salt), dim)

    layer.hvd_variable = _hashed_init_hvd_variable_class()(rows_of_ids, layer.name, layer.shadow, dim,
                                                           mpi_size=comm.size)
    layer.hvd_variable.hvd = adapter
    return layer, rows_of_ids


@tf.keras.utils.register_keras_serializable(package="FusedRec")
class PerFeatureEmbedding(EmbeddingLayer):
    """One TFRA HvdAllToAllEmbedding per feature (the baseline). Same arguments and call as FusedEmbedding.

    A feature declared with `shares` has no table of its own: its ids are looked up in the shared feature's table, in
    the same call as that feature's (one lookup per table and step, so the table's trainable handle sees both)."""

    def __init__(self, features, optimizer=_common.DEFAULT_OPTIMIZER, initializer=None, comm=None, name=None,
                 **kwargs):
        super().__init__(name=name, **kwargs)
        self.features = _common.parse_features(features, self.name)
        self.default_optimizer = cfg.optimizer_spec(optimizer, f"{self.name}: optimizer")
        self.default_initializer = initializers.get(initializer) or _common.default_initializer()
        self.comm = comm_lib.get_comm(comm)
        self._feature = {f.name: f for f in self.features}
        fused_groups, _ = _common.group_features(self.features, self.default_optimizer, self.default_initializer,
                                                 self.name)  # checks the shares
        self._shares = {n: owner for g in fused_groups for n, owner in g.shares}
        # Per table (the feature that owns it): the features it serves, itself first.
        self._served = {f.name: [f.name] for f in sorted(self.features, key=lambda f: f.name)
                        if f.name not in self._shares}
        for n in sorted(self._shares):
            self._served[self._shares[n]].append(n)
        self._layers, self._optimizers, self._fresh_rows = {}, {}, {}
        for f in sorted(self.features, key=lambda f: f.name):
            if f.name in self._shares:
                continue
            initializer = f.initializer if f.initializer is not None else self.default_initializer
            self._optimizers[f.name] = f.optimizer if f.optimizer is not None else self.default_optimizer
            self._layers[f.name], self._fresh_rows[f.name] = make_tfra_layer(
                f"{self.name}-{f.name}", f.dim, initializer, f.name, self.comm
            )
        self._injection = _common.Injection()  # see FusedEmbedding.injected
        self._shadows = [self._layers[n].shadow for n in sorted(self._layers)]
        self._table_params = [self._layers[n].params for n in sorted(self._layers)]

    @property
    def groups(self):
        """One group per table: per feature, the baseline fuses nothing (a feature that shares another's rows is in
        that feature's group, as in FusedEmbedding)."""
        groups, _ = cfg.group_features(self.features, self.default_optimizer, self.default_initializer)
        spec_of = {n: g for g in groups for n in g.feature_names}
        return [
            cfg.SpecGroup(spec_of[n].spec, tuple(sorted(self._served[n])), i, spec_of[n].encoding,
                          shares=tuple(sorted((s, n) for s in self._served[n][1:])))
            for i, n in enumerate(sorted(self._served))
        ]

    def optimizer_groups(self):
        return [(self._optimizers[n], [self._layers[n].shadow]) for n in sorted(self._layers)]

    def embedding_variables(self):
        return [self._layers[n].shadow for n in sorted(self._layers)]

    table_backend = "tfra"  # the baseline: one TFRA layer per feature

    def native_tables(self):
        """None: the per-feature baseline keeps TFRA tables."""
        return []

    def sharded_tables(self):
        """[ShardedTable] of the features, by name (each table is keyed by the feature's ids)."""
        return [ShardedTable(self._layers[n].name, self._layers[n].params, self._layers[n].shadow, ids_are_keys)
                for n in sorted(self._layers)]

    def tfra_layer(self, feature_name):
        """The TFRA layer holding the rows of a feature (the shared feature's, for a feature that shares them)."""
        return self._layers[self._shares.get(feature_name, feature_name)]

    def injected(self, outputs):
        """As FusedEmbedding.injected: within the block the next call returns `outputs`."""
        return self._injection.block(outputs, self.name)

    @unconverted
    def call(self, inputs, training=None):
        if self._injection.outputs is not None:
            return self._injection.take(self.features, inputs, self.name)
        flats, checks = _common.checked_inputs(self.features, inputs, self.name, self.comm,
                                               f"FusedRec/{scope_safe(self.name)}/valid")
        outputs = {}
        with tf.control_dependencies(checks):
            for name in sorted(self._layers):
                layer, fresh, served = self._layers[name], self._fresh_rows[name], self._served[name]
                ids = tf.identity(tf.concat([flats[n].ids for n in served], axis=0))
                if training is False:
                    rows = self._inference_rows(layer, fresh, ids)
                else:
                    if self.comm.size == 1 and fresh is not None:
                        # TFRA skips the relocation with one worker: insert here, where the ids are local.
                        unique_ids, _ = tf.unique(ids)
                        insert = insert_missing_rows(
                            layer.params, unique_ids, lambda m: fresh(tf.gather(unique_ids, m))  # noqa: B023
                        )
                        ids = _common.after([insert], ids)
                    rows = layer(ids)
                parts = tf.split(rows, [tf.size(flats[n].ids) for n in served], num=len(served), axis=0)
                for n, part in zip(served, parts):
                    outputs[n] = _inputs.unflatten_rows(self._feature[n], part, flats[n].layout)
        return outputs

    def _inference_rows(self, layer, fresh, ids):
        """Rows of ids [n] without inserting and without the trainable path, read on their owners as in training (the
        same keys all-to-all, a plain table read there, the embeddings all-to-all back), so held-out predictions see
        every worker's rows."""

        def read(keys):
            rows, exists = layer.params.lookup(keys, return_exists=True)
            return rows if fresh is None else tf.where(exists[:, None], rows, fresh(keys))

        if self.comm.size == 1:
            return read(ids)
        hvd_variable = layer.hvd_variable
        # The base class's relocation: ours would insert the new ids' initial rows.
        received, remote_sizes, indices = _hvd_variable_class().__relocate_dense_feature__(hvd_variable, ids)
        unique_ids, index = tf.unique(received)
        rows, _ = hvd_variable.hvd.alltoall(tf.gather(read(unique_ids), index), splits=remote_sizes)
        shape = tf.concat([tf.shape(ids), [layer.embedding_size]], axis=0)
        return tf.scatter_nd(tf.expand_dims(tf.concat(indices, axis=0), -1), rows, shape)

    def get_config(self):
        config = super().get_config()
        config.update(_common.layer_config(self.features, self.default_optimizer, self.default_initializer))
        return config
