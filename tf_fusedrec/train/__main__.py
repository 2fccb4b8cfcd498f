import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TFRA imports pkg_resources and warns on every layer about savers this app does not use; keep the output readable.
warnings.filterwarnings("ignore", message="pkg_resources is deprecated")

import tf_fusedrec  # noqa: E402,F401  (selects Keras 2 before TensorFlow loads)
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")

from tf_fusedrec.train.app import main  # noqa: E402

main()
