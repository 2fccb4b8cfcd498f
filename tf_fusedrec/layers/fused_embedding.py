"""FusedEmbedding: the drop-in replacement for a dict of per-feature TFRA embedding layers."""

import tensorflow as tf

from tf_fusedrec import config as cfg
from tf_fusedrec import initializers
from tf_fusedrec.distributed import comm as comm_lib
from tf_fusedrec.distributed import lookup as lookup_lib
from tf_fusedrec.distributed.table import EmbeddingTable
from tf_fusedrec.layers import _common
from tf_fusedrec.layers import _inputs

DEDUP_MODES = ("segment", "none")
FUSION_MODES = ("deferred", "source_hash")
STATISTICS = ("ids", "unique_sent", "unique_looked_up")


@tf.keras.utils.register_keras_serializable(package="FusedRec")
class FusedEmbedding(tf.keras.layers.Layer):
    """Embeds a dict of sparse features with one all-to-all pair per spec group (FusedRec, Algorithm 1).

    Features with equal (dim, optimizer, initializer) form a group, ordered by name; each group has one TFRA
    dynamic_embedding table, sharded by owner_of so each worker holds only the keys it owns. A training step does,
    per group, one keys all-to-all (ids and categories together) and one embeddings all-to-all, where per-feature
    TFRA layers do two per feature. Results equal the per-feature layers' (lossless) and, with the default Hashed
    initializer, do not depend on the number of workers.

    Args:
      features: list of fr.Feature.
      optimizer: default sparse optimizer of features that name none (a name such as "adagrad" or a dict with
        "name" and hyperparameters). Used by fr.train.make_optimizer.
      initializer: default initializer of features that name none; default fr.initializers.Hashed(0, 0.05).
      comm: None/"auto" (Horovod when initialised with size > 1, else single process), "single", "horovod", or
        a comm object. Horovod must be initialised before the layer is created.
      dedup: "segment" (FusedRec: segment unique before sending) or "none" (ablation: send duplicates).
      fusion: "deferred" (FusedRec: the category travels with the id and is hashed in on the owner) or
        "source_hash" (ablation, the paper's TFRA-fused: hash the category in before sending; the owner no longer
        knows categories, so unique_looked_up statistics are -1).

    Call:
      inputs: dict feature name -> ids: [B], [B, L] (padding -1) or tf.RaggedTensor [B, None] of the feature's
        key_dtype, ids >= 0.
      training: False looks up without inserting new ids and without the trainable path.

    Returns:
      dict feature name -> float32 [B, dim] (ids [B] or a combiner), [B, L, dim] or ragged [B, None, dim].
    """

    def __init__(self, features, optimizer=_common.DEFAULT_OPTIMIZER, initializer=None, comm=None,
                 dedup="segment", fusion="deferred", name=None, **kwargs):
        super().__init__(name=name, **kwargs)
        self.features = _common.parse_features(features, self.name)
        if dedup not in DEDUP_MODES:
            raise ValueError(f"{self.name}: dedup must be one of {DEDUP_MODES}, got {dedup!r}")
        if fusion not in FUSION_MODES:
            raise ValueError(f"{self.name}: fusion must be one of {FUSION_MODES}, got {fusion!r}")
        self.dedup, self.fusion = dedup, fusion
        self.default_optimizer = cfg.optimizer_spec(optimizer, f"{self.name}: optimizer")
        self.default_initializer = initializers.get(initializer) or _common.default_initializer()
        self._feature = {f.name: f for f in self.features}
        self._groups, self._initializers = cfg.group_features(
            self.features, self.default_optimizer, self.default_initializer
        )
        self.comm = comm_lib.get_comm(comm)
        self.tables = []
        for group in self._groups:
            initializer = self._initializers[group.feature_names[0]]
            seed = initializer.seed if initializers.is_hashed(initializer) else 0
            salts = [initializers.feature_salt(seed, n) for n in group.feature_names]
            self.tables.append(EmbeddingTable(f"{self.name}/{group.name}", group.spec.dim, initializer, salts))
        # Tracked by Keras as the layer's trainable weights (empty in a tf.compat.v1 graph, see EmbeddingTable).
        self._shadows = [t.shadow for t in self.tables if t.shadow is not None]
        # Tracked so tf.train.Checkpoint saves the tables' contents (the shadows only hold one step's rows).
        self._table_params = [t.params for t in self.tables]
        self._stat_order = [n for g in self._groups for n in g.feature_names]
        self._statistics = tf.Variable(
            tf.zeros([len(self._stat_order), len(STATISTICS)], tf.int64), trainable=False, name="statistics"
        )

    @property
    def groups(self):
        """The SpecGroups, in deterministic order."""
        return list(self._groups)

    def optimizer_groups(self):
        """[(OptimizerSpec, [trainable table variables])] per group, for fr.train.make_optimizer."""
        return [(g.spec.optimizer, t.trainable_variables) for g, t in zip(self._groups, self.tables)]

    def embedding_variables(self):
        return [v for t in self.tables for v in t.trainable_variables]

    def collective_prefix(self, group):
        return f"FusedRec/{self.name}/{group.name}"

    def call(self, inputs, training=None):
        flats, checks = _common.flatten_inputs(self.features, inputs, self.name)
        outputs, stat_rows = {}, []
        with tf.control_dependencies(checks):
            for group, table in zip(self._groups, self.tables):
                with tf.name_scope(group.name):
                    ids = [tf.identity(flats[n].ids) for n in group.feature_names]
                    prefix = self.collective_prefix(group)
                    with tf.name_scope("input_dist"):
                        dist = lookup_lib.input_dist(group, ids, self.comm, prefix, self.dedup, self.fusion)
                    with tf.name_scope("lookup"):
                        looked = lookup_lib.lookup(group, dist, table, training, self.fusion)
                    with tf.name_scope("output_dist"):
                        rows = lookup_lib.output_dist(looked.embeddings, dist, self.comm, prefix,
                                                      group.num_categories)
                for i, name in enumerate(group.feature_names):
                    outputs[name] = _inputs.unflatten_rows(self._feature[name], rows[i], flats[name].layout)
                unique_sent = looked.unique_looked_up if dist.unique_sent is None else dist.unique_sent
                stat_rows.append(tf.stack([tf.cast(dist.feature_sizes, tf.int64), unique_sent,
                                           looked.unique_looked_up], axis=1))
        update = self._statistics.assign(tf.concat(stat_rows, axis=0))
        if tf.compat.v1.executing_eagerly_outside_functions():
            return outputs  # eager and tf.function run the stateful update without being asked
        return {name: _common.after([update], out) for name, out in outputs.items()}

    def statistics(self):
        """Per feature, from the last call on this worker: {"ids": ids looked up (padding excluded),
        "unique_sent": unique ids this worker sent, "unique_looked_up": unique ids of the feature this worker
        looked up in its table as owner (from category_unique's per-category counts; -1 with fusion="source_hash")}.
        Values are int64 scalars (tensors in graph mode)."""
        values = self._statistics.read_value()
        return {
            name: {stat: values[i, j] for j, stat in enumerate(STATISTICS)} for i, name in enumerate(self._stat_order)
        }

    def get_config(self):
        config = super().get_config()
        config.update(_common.layer_config(self.features, self.default_optimizer, self.default_initializer))
        config.update({"dedup": self.dedup, "fusion": self.fusion})
        return config
