"""tf_fusedrec: fused, lossless embedding communication for TFRA + Horovod recommendation training."""

import os as _os

# TFRA's Keras layers need Keras 2; the switch only works if it is set before TensorFlow is imported.
_os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

__version__ = "0.1.0"
