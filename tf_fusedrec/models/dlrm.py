"""DLRM (Naumov et al. 2019): bottom MLP on dense features, pairwise dot interaction, top MLP."""

import tensorflow as tf

from tf_fusedrec.layers.protocol import unconverted
from tf_fusedrec.models import _blocks


class DLRM(tf.keras.Model):
    """DLRM on top of an embedding layer.

    Embeddings whose dim differs from the bottom MLP's output are projected to it (one linear map per dim), so
    groups of several dims (several specs) can interact.

    Args:
      embedding: FusedEmbedding or PerFeatureEmbedding.
      bottom_mlp: widths of the bottom MLP; the last is the interaction dim.
      top_mlp: widths of the top MLP before the final logit.
      num_dense: number of dense features (0: none; then the interaction runs over embeddings only).
      tasks: logits per sample: 1 gives [B], more give [B, tasks] (one top MLP, an output per task: the sequence
        sources' click and conversion, with the history a pooled bag; the GRM's baseline).
    """

    def __init__(self, embedding, bottom_mlp=(64, 16), top_mlp=(64, 32), num_dense=13, seed=0, name="dlrm",
                 tasks=1):
        super().__init__(name=name)
        if isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1:
            raise ValueError(f"DLRM: tasks must be a positive int, got {tasks!r}")
        self.tasks = tasks
        self.embedding = embedding
        self.feature_names = sorted(f.name for f in embedding.features)
        self.num_dense = num_dense
        self.interaction_dim = bottom_mlp[-1]
        self.bottom = _blocks.mlp(bottom_mlp, "bottom_mlp", seed=seed) if num_dense else None
        dims = sorted({f.dim for f in embedding.features if f.dim != self.interaction_dim})
        self.projections = {
            str(d): tf.keras.layers.Dense(self.interaction_dim, use_bias=False, name=f"project_d{d}",
                                          kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + 100 + d))
            for d in dims
        }
        self._dims = {f.name: f.dim for f in embedding.features}
        self.top = _blocks.mlp(list(top_mlp) + [tasks], "top_mlp", last_activation=None, seed=seed + 1000)

    @unconverted
    def call(self, inputs, training=None):
        outputs = _blocks.compute_dtype(self.embedding(_blocks.sparse_inputs(inputs), training=training),
                                        self.compute_dtype)
        vectors = []
        for name, x in zip(self.feature_names, _blocks.pooled(outputs, self.feature_names)):
            if self._dims[name] != self.interaction_dim:
                x = self.projections[str(self._dims[name])](x)
            vectors.append(x)
        if self.bottom is not None:
            dense = self.bottom(inputs["dense"])
            vectors = [dense] + vectors
        interactions = _blocks.pairwise_dots(vectors)  # [B, F (F - 1) / 2]: the pairs i < j, row by row
        parts = [interactions] + ([dense] if self.bottom is not None else [])
        out = self.top(tf.concat(parts, axis=1))
        return _blocks.logits(out[:, 0] if self.tasks == 1 else out)
