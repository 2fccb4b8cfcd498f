"""tf_fusedrec: fused, lossless embedding communication for TFRA + Horovod recommendation training.

    import tf_fusedrec as fr
    emb = fr.FusedEmbedding([fr.Feature("user_id", dim=16), fr.Feature("tags", dim=8, combiner="mean")])
"""

import os as _os

# TFRA's Keras layers need Keras 2; the switch only works if it is set before TensorFlow is imported.
_os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

__version__ = "0.1.0"

from tf_fusedrec import initializers  # noqa: E402
from tf_fusedrec import ops  # noqa: E402
from tf_fusedrec.config import Feature, OptimizerSpec, Spec, SpecGroup  # noqa: E402
from tf_fusedrec.layers import FusedEmbedding, PerFeatureEmbedding  # noqa: E402
from tf_fusedrec import train  # noqa: E402

__all__ = [
    "Feature",
    "FusedEmbedding",
    "OptimizerSpec",
    "PerFeatureEmbedding",
    "Spec",
    "SpecGroup",
    "initializers",
    "ops",
    "train",
]
