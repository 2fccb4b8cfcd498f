"""Public Keras layers."""

from tf_fusedrec.layers.fused_embedding import FusedEmbedding
from tf_fusedrec.layers.per_feature_embedding import PerFeatureEmbedding

__all__ = ["FusedEmbedding", "PerFeatureEmbedding"]
