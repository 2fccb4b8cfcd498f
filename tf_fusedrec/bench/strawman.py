"""TFRA's hand-fusion trick, the expert TFRA user's strawman: per embedding dim, the ids of all features of that
dim are offset by (feature index << 48), concatenated and looked up through one HvdAllToAllEmbedding.

It needs one all-to-all pair per dim, like FusedEmbedding, but the category is hashed into the key before sending
(the owner cannot tell features apart), ids must fit in 48 bits, and every feature of a dim shares the first
feature's optimizer. Kept in the benchmark only.
"""

import tensorflow as tf

from tf_fusedrec import config as cfg
from tf_fusedrec import initializers
from tf_fusedrec.distributed import comm as comm_lib
from tf_fusedrec.layers import _common
from tf_fusedrec.layers.protocol import EmbeddingLayer, unconverted
from tf_fusedrec.layers import _inputs
from tf_fusedrec.layers.per_feature_embedding import make_tfra_layer

FEATURE_SHIFT = 48


class HandFusedTFRAEmbedding(EmbeddingLayer):
    def __init__(self, features, optimizer=_common.DEFAULT_OPTIMIZER, initializer=None, comm=None, name=None):
        super().__init__(name=name)
        self.features = _common.parse_features(features, self.name)
        self.default_optimizer = cfg.optimizer_spec(optimizer)
        self.comm = comm_lib.get_comm(comm)
        initializer = initializers.get(initializer) or _common.default_initializer()
        self._by_dim = {}
        for f in sorted(self.features, key=lambda f: f.name):
            self._by_dim.setdefault(f.dim, []).append(f)
        self._layers, self._optimizers = {}, {}
        for dim, members in sorted(self._by_dim.items()):
            layer, _ = make_tfra_layer(f"{self.name}-d{dim}", dim, initializer, f"d{dim}", self.comm)
            self._layers[dim] = layer
            first = members[0]
            self._optimizers[dim] = first.optimizer if first.optimizer is not None else self.default_optimizer
        self._shadows = [self._layers[d].shadow for d in sorted(self._layers)]

    table_backend = "tfra"

    def native_tables(self):
        """None: TFRA's hand fusion keeps TFRA tables."""
        return []

    def optimizer_groups(self):
        return [(self._optimizers[d], [self._layers[d].shadow]) for d in sorted(self._layers)]

    @unconverted
    def call(self, inputs, training=None):  # noqa: ARG002
        flats, checks = _common.flatten_inputs(self.features, inputs, self.name)
        outputs = {}
        with tf.control_dependencies(checks):
            for dim, members in sorted(self._by_dim.items()):
                ids = [flats[f.name].ids + (i << FEATURE_SHIFT) for i, f in enumerate(members)]
                sizes = [tf.size(x) for x in ids]
                rows = self._layers[dim](tf.concat(ids, axis=0))
                for f, r in zip(members, tf.split(rows, tf.stack(sizes), num=len(members))):
                    outputs[f.name] = _inputs.unflatten_rows(f, r, flats[f.name].layout)
        return outputs
