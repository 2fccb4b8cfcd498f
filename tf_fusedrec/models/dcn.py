"""DCN-v2 (Wang et al. 2021): explicit cross layers x_{l+1} = x_0 * (W x_l + b) + x_l, then a deep MLP."""

import tensorflow as tf

from tf_fusedrec.layers.protocol import unconverted
from tf_fusedrec.models import _blocks


class CrossLayer(tf.keras.layers.Layer):
    def __init__(self, seed=0, **kwargs):
        super().__init__(**kwargs)
        self.seed = seed

    def build(self, input_shape):
        d = int(input_shape[0][-1])
        self.dense = tf.keras.layers.Dense(d, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=self.seed))
        super().build(input_shape)

    @unconverted
    def call(self, inputs):
        x0, x = inputs
        return x0 * self.dense(x) + x


class DCNv2(tf.keras.Model):
    """DCN-v2 (stacked): [dense, pooled embeddings] -> cross layers -> deep MLP -> logit.

    Args:
      embedding: FusedEmbedding or PerFeatureEmbedding.
      cross_layers: number of cross layers.
      deep_mlp: widths of the deep MLP.
      num_dense: number of dense features (0: none).
    """

    def __init__(self, embedding, cross_layers=2, deep_mlp=(64, 32), num_dense=13, seed=0, name="dcn_v2"):
        super().__init__(name=name)
        self.embedding = embedding
        self.feature_names = sorted(f.name for f in embedding.features)
        self.num_dense = num_dense
        self.cross = [CrossLayer(seed=seed + i, name=f"cross_{i}") for i in range(cross_layers)]
        self.deep = _blocks.mlp(list(deep_mlp) + [1], "deep_mlp", last_activation=None, seed=seed + 1000)

    @unconverted
    def call(self, inputs, training=None):
        outputs = _blocks.compute_dtype(self.embedding(_blocks.sparse_inputs(inputs), training=training),
                                        self.compute_dtype)
        parts = _blocks.pooled(outputs, self.feature_names)
        if self.num_dense:
            parts = [inputs["dense"]] + parts
        x0 = tf.concat(parts, axis=1)
        x = x0
        for layer in self.cross:
            x = layer((x0, x))
        return _blocks.logits(self.deep(x)[:, 0])
